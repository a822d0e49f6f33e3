"""Training with model.fit: callbacks, backup, optimizer, losses, distribution, averaging,
monitoring and its figures (`plotting`)."""
