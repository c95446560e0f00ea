"""Workstation-side exporters: checkpoint -> per-width slices -> .tflite files + bundle manifest."""
