"""SpanDrop and Beta-SpanDrop: the unit sampler and transform, the shared fine-tuning machinery the task
features build their adapters on, and the FINDANIMALS task and experiment."""
