"""Names of the attribution stages (``gpulens_stage_success{stage}``), one per source kind; the
real and the simulated sources report under the same names."""

PODRESOURCES = "podresources"
"""The kubelet's PodResources API: which container holds which device."""
KUBE_API = "kube_api"
"""The Kubernetes API watch: pod phases, owner workloads, container IDs."""
CGROUP = "cgroup"
"""``/proc/<pid>/cgroup``: which container a GPU process runs in."""
RESOURCE_SLICES = "resourceslices"
"""The Kubernetes API watch of this node's DRA ResourceSlices: what each claimed device is."""
