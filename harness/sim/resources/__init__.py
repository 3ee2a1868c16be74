"""Resource faults: the cgroups of a job's nodes, and the faults made by writing to them
(``slow_node``: a CPU quota; ``memory_limit``: the kernel's OOM killer). See ``faults``."""

from harness.sim.resources.cgroups import CgroupSupport, JobCgroup, NodeCgroup, parse_bytes, probe
from harness.sim.resources.faults import ResourceFaults, unhealed_message

__all__ = ["CgroupSupport", "JobCgroup", "NodeCgroup", "ResourceFaults", "parse_bytes", "probe",
           "unhealed_message"]
