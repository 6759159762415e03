"""Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms").

Every coordinate moves by exactly lr per step, in the direction of the sign of a blend of the momentum and the
new gradient; the momentum itself is updated afterwards with a slower beta. One state tensor per parameter
(AdamW keeps two), and since the update is larger than AdamW's, the paper uses an lr 3-10x smaller and a weight
decay 3-10x larger.
"""

import torch


class Lion(torch.optim.Optimizer):
    def __init__(self, params, lr: float = 1e-4, betas: tuple[float, float] = (0.9, 0.99), weight_decay: float = 0.0):
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, (beta1, beta2), decay = group["lr"], group["betas"], group["weight_decay"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                state = self.state[param]
                if not state:
                    state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
                momentum, grad = state["exp_avg"], param.grad
                param.mul_(1.0 - lr * decay)  # decoupled weight decay, as in AdamW
                param.add_(torch.sign(momentum.lerp(grad, 1.0 - beta1)), alpha=-lr)  # beta1 * m + (1 - beta1) * g
                momentum.lerp_(grad, 1.0 - beta2)
        return loss
