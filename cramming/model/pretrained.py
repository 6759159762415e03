"""What every crammed model shares as a Hugging Face PreTrainedModel: its config class, loading checkpoints saved
under older names, saving its own code beside the weights (so the folder loads without cramming) and the weights'
init. The model itself is modeling_crammed.py.
Only relative imports: Hugging Face copies this folder flat for `trust_remote_code=True`.
"""

import shutil
from pathlib import Path

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.dynamic_module_utils import get_relative_imports

from .arch import ArchConfig
from .blocks import stack_of
from .configuration_crammed import OLD_KEYS, SECTIONS, CrammedConfig
from .parametrization import init_std, parametrization
from .registry import Registry, copy_into

# save_pretrained(push_to_hub=True, ...)'s keywords that only the push reads.
HUB_KEYWORDS = ("repo_id", "commit_message", "create_pr", "private", "revision", "commit_description", "tags")


class CrammedPreTrainedModel(PreTrainedModel):
    config_class = CrammedConfig
    base_model_prefix = "encoder"
    _supports_sdpa = True
    # gradient_checkpointing_enable(): the blocks are GradientCheckpointingLayers (impl.activation_checkpointing too)
    supports_gradient_checkpointing = True
    drops_tokens = False  # a head whose training forward drops tokens (arch.token_dropping) says so
    pipeline_tag = None  # the hub's task for a model pretrained with this head (its model card says it)

    @property
    def logit_multiplier(self) -> float:
        """What the LM head multiplies its input by: W (h * this) + b (1 / m under mup, else 1)."""
        return parametrization(self.config).output_multiplier(self.config)

    @classmethod
    def from_pretrained(cls, *args, key_mapping: dict | None = None, **kwargs):
        """Hugging Face's loader, reading checkpoints saved before a rename too (OLD_KEYS)."""
        return super().from_pretrained(*args, key_mapping={**OLD_KEYS, **(key_mapping or {})}, **kwargs)

    def save_pretrained(self, save_directory, *args, push_to_hub: bool = False, **kwargs):
        """Hugging Face's save, then the model code this config needs (copy_model_code) and the registry's own code
        over the package's re-export of it (registry.py), so the folder loads without cramming. A push goes through
        push_to_hub, which saves through here again. With is_main_process=False it writes nothing, as transformers'."""
        hub = {key: kwargs.pop(key) for key in HUB_KEYWORDS if key in kwargs}
        folder = Path(save_directory)
        before = {path.name for path in folder.glob("*.py")} if folder.is_dir() else set()
        super().save_pretrained(save_directory, *args, **kwargs)
        if not kwargs.get("is_main_process", args[0] if args else True):
            return None  # another process of a distributed run: the main one writes the folder (transformers' rule)
        self.copy_model_code(folder, before)
        copy_into(save_directory)
        if push_to_hub:
            repo_id = hub.pop("repo_id", folder.name)  # Hugging Face's default: the folder's name
            return self.push_to_hub(repo_id, token=kwargs.get("token"), **hub)
        return None

    def copy_model_code(self, folder: Path, before=frozenset()) -> None:
        """The file of every module the config's auto_map names, with its relative imports, as transformers follows
        them: transformers copies only the saved class's, yet the folder loads as every Auto class it lists
        (heads.py's too). variants.py is written for this config (variants_text), so the folder holds only the
        variant files it uses. Those transformers' copy of this installation's variants.py brought besides are
        removed again: only files this save wrote (the package's own bytes), none the folder held before. The files
        come from beside this one, else (a model whose code transformers copied from a checkpoint folder, for one
        class only) from the folder it was loaded from."""
        sources = [Path(__file__).parent]
        loaded_from = str(getattr(self.config, "_name_or_path", "") or "")
        if loaded_from and Path(loaded_from).is_dir():
            sources.append(Path(loaded_from))
        todo = sorted({name.split(".")[0] + ".py" for name in (self.config.auto_map or {}).values()})
        written = set()
        while todo:
            name = todo.pop(0)
            source = None if name in written else next((s / name for s in sources if (s / name).is_file()), None)
            if source is None:
                continue  # another repository's code ("repo--module"), or none to be had: left as transformers does
            target = folder / name
            if name == "variants.py":
                target.write_text(variants_text(source.read_text(), variant_modules(self.config)))
            elif source.resolve() != target.resolve():
                shutil.copyfile(source, target)
            written.add(name)
            todo += [f"{module}.py" for module in get_relative_imports(str(target))]
        for path in folder.glob("*.py"):  # what transformers' copy of this installation's variants.py brought
            package_file = sources[0] / path.name
            if path.name not in written | set(before) and package_file.is_file() \
                    and path.read_bytes() == package_file.read_bytes():
                path.unlink()

    def init_std_for(self, module) -> float:
        """The std arch.init (and arch.zero_init_out) gives this module's weights (parametrization.py)."""
        return init_std(self.config, module)

    @torch.no_grad()
    def _init_weights(self, module):
        # transformers.initialization skips tensors already loaded from a checkpoint.
        if isinstance(module, (nn.Linear, nn.Embedding)):
            init.normal_(module.weight, mean=0.0, std=self.init_std_for(module))
            if getattr(module, "bias", None) is not None:
                init.zeros_(module.bias)
        elif isinstance(module, (nn.LayerNorm, nn.RMSNorm)):
            if module.weight is not None:
                init.ones_(module.weight)
            if getattr(module, "bias", None) is not None:
                init.zeros_(module.bias)
        elif hasattr(module, "init_weights_"):  # every module of ours with weights of its own initialises them
            module.init_weights_(init, self.init_std_for(module))


def variant_modules(config) -> set[str]:
    """The modules of the registered entries the config's architecture options name (arch.layout's blocks,
    arch.linear's layer, ...) and of its stack: a saved folder's variants.py imports those that are variant files."""
    sections = {ArchConfig: config, **{schema: getattr(config, name) for name, schema in SECTIONS.items()}}
    modules = set()
    for (schema, field), registry in Registry.serving.items():
        if schema not in sections:
            continue  # an option of the run (impl, train), not of the model
        values = getattr(sections[schema], field)
        for value in values if isinstance(values, list) else [values]:
            entry = registry.get(value)
            modules.add(getattr(entry, "__module__", "").rsplit(".", 1)[-1])
    stack = stack_of(config)
    return modules | ({stack.__module__.rsplit(".", 1)[-1]} if stack is not None else set())


def variants_text(text: str, used: set[str]) -> str:
    """variants.py for a folder that uses these modules: the lines of this installation's (`text`), less the
    imports of the variant files it does not use."""
    lines = text.splitlines(keepends=True)
    return "".join(line for line in lines if not line.startswith("from .") or line.split()[1][1:] in used)
