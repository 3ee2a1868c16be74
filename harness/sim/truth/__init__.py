"""What a job did and what it is judged by: its events, its training, its verdicts.

* ``progress``: ``report_step`` / ``report_checkpoint``, the lines a worker adds (run in the
  workers); ``digest``: a training state's fingerprint;
* ``timeline``: ``Timeline``, the job's merged event stream; ``training``: what a fault cost
  the training (resume latency, lost seconds by category, goodput);
* ``invariants`` and ``net_invariants``: what every elastic job must keep;
* ``hangs`` and ``stacks``: a hung job named, with its workers' Python stacks;
* ``job_result``: the nodes' results merged into one ``JobResult``;
* ``golden`` and ``twin``: the fault-free twin and its verdict; ``verdicts``: what
  ``Job.invariant_problems`` and ``Job.compare_golden`` hand their calls to;
* ``projection``: ``project_goodput``, a job's measured fault cost at scale.

Imports nothing: a worker imports ``progress`` and must not pay for the rest.
"""
