/* Puts itself in uninterruptible sleep (D state): a vfork parent waits, TASK_KILLABLE,
 * until its child execs or exits; the child just sleeps. */
#include <stdio.h>
#include <unistd.h>

int main(void) {
    printf("DSTATE %d\n", (int)getpid());
    fflush(stdout);
    pid_t child = vfork();
    if (child == 0) {
        sleep(60);
        _exit(0);
    }
    return 0;
}
