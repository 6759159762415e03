"""The time-budgeted trainer: schedules, masking, the loop, metrics and checkpoints."""
