"""nodeprep: build NVIDIA kernel drivers ahead of time, install them into versioned roots,
label GPU nodes and join them to Kubernetes."""

__version__ = "0.1.0"
