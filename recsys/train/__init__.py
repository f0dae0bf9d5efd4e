"""Training: losses and samplers, the loop, run directories, distributed setup."""
