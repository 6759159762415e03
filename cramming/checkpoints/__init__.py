"""What cramming writes to disk and reads back, below both training and evaluation: the final model folder
(model_folder.py), a step folder (step_folder.py), and reading the torch pickles in either (pickled.py)."""
