"""Energy model, hardware and model catalogues, calibration, NVML meter, attribution."""
