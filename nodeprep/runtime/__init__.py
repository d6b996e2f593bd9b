"""The container runtime's configuration for GPUs: containerd's drop-in (the `nvidia` runtime, CDI;
the handlers' base spec), NVIDIA Container Toolkit's config, hooks.d, the CDI spec and the hook
program the node runs, planned (plan.py) and applied (configure.py). `nodeprep join` adds the
Kubernetes side (nodeprep.join). This package imports nothing: driver activation imports
nodeprep.runtime.cdi on every run and must not load the rest."""
