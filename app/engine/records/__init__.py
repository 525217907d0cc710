"""What a run measures and writes: summary.json's record, the telemetry sinks' figures, the
gradient noise scale, the profiler window."""
