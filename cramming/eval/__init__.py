"""GLUE evaluation: task data (local glue_data/ TSVs or the hub), a user-defined task, and the metrics."""
