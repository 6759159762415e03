"""What the budget loop calls besides training: one small protocol, the hooks called in turn.

A hook overrides only the moments it cares about; every method is a no-op here. The loop calls
- on_begin(trainer, state) when the budget clock starts (fresh or resumed),
- on_step(trainer, state) after each applied optimizer step,
- on_checkpoint(trainer, state) just before a checkpoint is written (to put its own numbers into `state`),
- on_between(trainer, state) once per step after the ranks agreed on the clock (and after a due checkpoint),
- on_pause() and on_resume() around time that is not budget time (a validation: trainer.paused()),
- on_rollback(saved, path) after train.nonfinite=rollback loaded a checkpoint's weights (`saved`: its state.pt),
- on_end(trainer, state) when the budget is spent.
The energy meter, the weight averaging and the periodic validation are hooks (energy.py, averaging.py,
heldout.py); a new one is a class with the methods it needs, given to the Trainer in `hooks`. A hook may end
the run early and cleanly with trainer.end(why) (the validation reaching train.target_loss): the loop stops
before its next step, then on_end and the final validation run as after a spent budget.
"""


class Hook:
    def on_begin(self, trainer, state) -> None:
        pass

    def on_step(self, trainer, state) -> None:
        pass

    def on_checkpoint(self, trainer, state) -> None:
        pass

    def on_between(self, trainer, state) -> None:
        pass

    def on_pause(self) -> None:
        pass

    def on_resume(self) -> None:
        pass

    def on_rollback(self, saved: dict, path) -> None:
        pass

    def on_end(self, trainer, state) -> None:
        pass
