"""Quantizers that turn the trained nested Bayesian network into a quantized Bayesian network."""
