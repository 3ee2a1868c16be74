"""What a person reads about elastic tests, one job per module, bottom up:

* ``model``: what a job's drawn timeline shows, computed once from its events;
* ``chart``: that timeline as text (a failing test's report section);
* ``stats``: the figures per job and per session (junit properties, terminal summary);
* ``failures``: why ranks failed, root cause first;
* ``twin`` and ``twin_svg``: what a job's fault-free twin said, drawn under the run's losses;
* ``svg`` and ``page``: one job's self-contained HTML page (``--elastic-report``);
* ``legend``: the markup of a drawing's legend (the page's and the twin's);
* ``index``: the session's pages tied together (``index.html``, ``summary.json``).

Nothing is imported here: a test run without ``--elastic-report`` loads only what it uses
(``stats``, and ``chart``/``failures`` for a failure).
"""
