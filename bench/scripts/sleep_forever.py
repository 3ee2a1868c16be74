"""Sleeps until killed (a job that stays up while the bench works on its filesystem)."""

import time

time.sleep(600)
