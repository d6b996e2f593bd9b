"""GPU health after the join: NVIDIA's Xid catalog (catalog), the kernel's Xid lines (kmsg), the pure
verdict (verdict), the NVML reader (nvml), the Node condition (publish), the loop (service) and its
systemd unit (unit)."""
