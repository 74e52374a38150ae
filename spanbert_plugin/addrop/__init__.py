"""AD-DROP: attribution-driven dropout of attention positions, the attribution maps and the task mixin that
fine-tuning tasks use."""
