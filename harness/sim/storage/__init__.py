"""The jobs' storage: a FUSE filesystem the harness serves, and the storage faults.

* ``mount``: the harness side (start, control, unmount, sweep of dead owners' mounts);
* ``server``: the filesystem process (``python -m harness.sim.storage.server``);
* ``fast_path``: what keeps a checkpoint save cheap through it (direct writes, libfuse's copy);
* ``record``: the write-back record (what a node crash loses: the semantics);
* ``owners``: which node a calling process belongs to;
* ``link``: the control link between the two;
* ``faults``: ``StorageFaults``, ``job.storage``: the faults as the job applies them.
"""
