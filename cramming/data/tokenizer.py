"""Train a tokenizer on the corpus with `tokenizers`, wrapped as a PreTrainedTokenizerFast.

Special tokens are the BERT set in a fixed order, so ids 0-4 are always [PAD] [UNK] [CLS] [SEP] [MASK],
and the post-processor adds [CLS] a [SEP] (b [SEP]) exactly as packing and GLUE evaluation expect.
Causal checkpoints carry a copy made for generation (`for_generation`).
"""

import json
import re
from collections.abc import Iterable
from pathlib import Path
from tempfile import TemporaryDirectory

import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from ..errors import UserError
from ..model_code import tokenizer_modules
from ..registry import Registry
from ..untrusted import check_tokenizer_files, refuse_links_outside

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
# The ids every tokenizer trained here gives them (what a model needs before any data exists, e.g. a dry run).
SPECIAL_IDS = {name: SPECIAL_TOKENS.index(f"[{name.upper()}]") for name in ("pad", "cls", "sep", "mask")}
TOKENIZER_KINDS = Registry("tokenizer kind")


def _normalizer(lowercase: bool, strip_accents: bool, ascii_only: bool):
    steps = [normalizers.NFD()]
    if lowercase:
        steps.append(normalizers.Lowercase())
    if strip_accents:
        steps.append(normalizers.StripAccents())
    if ascii_only:
        steps.append(normalizers.Replace(Regex(r"[^\x00-\x7F]"), ""))
    return normalizers.Sequence(steps)


@TOKENIZER_KINDS.register("wordpiece")
def _wordpiece(vocab_size: int):
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]", max_input_chars_per_word=100))
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    return tok, trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False)


@TOKENIZER_KINDS.register("bpe")
def _bpe(vocab_size: int):
    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    return tok, trainer


@TOKENIZER_KINDS.register("unigram")
def _unigram(vocab_size: int):
    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, unk_token="[UNK]", show_progress=False
    )
    return tok, trainer


def train_tokenizer(texts: Iterable[str], kind: str, vocab_size: int, max_length: int, lowercase: bool = True,
                    strip_accents: bool = True, ascii_only: bool = True) -> PreTrainedTokenizerFast:
    tok, trainer = TOKENIZER_KINDS.get_or_explain(kind)(vocab_size)
    tok.normalizer = _normalizer(lowercase, strip_accents, ascii_only)
    tok.train_from_iterator(texts, trainer=trainer)
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        model_max_length=max_length,
        pad_token="[PAD]",
        unk_token="[UNK]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )


def read_tokenizer(folder: Path, what: str, fast: bool = True):
    """A tokenizer someone else saved (a step folder's, a checkpoint's, a prepared folder's): its files of a
    tokenizer's size, its config naming no code, loaded without running any (trust_remote_code=False); whatever
    fails to load it is one line naming `what`. fast: as PreTrainedTokenizerFast (what cramming saves)."""
    folder = Path(folder)
    check_tokenizer_files(folder)
    if names := tokenizer_modules(folder):
        raise UserError(f"{what}: its tokenizer config names code ({names[0]}.py), which cramming never writes; it "
                        "was not read")
    try:
        if fast:
            return PreTrainedTokenizerFast.from_pretrained(folder)
        return AutoTokenizer.from_pretrained(folder, trust_remote_code=False)
    except Exception as err:  # noqa: BLE001  tokenizer files fail to load in many types (the Rust parser's too)
        raise UserError(f"{what}: its tokenizer could not be loaded ({type(err).__name__}: "
                        f"{next((s for s in str(err).splitlines() if s.strip()), '')[:200]})") from None


def load_pretrained_tokenizer(name: str, max_length: int) -> PreTrainedTokenizerFast:
    """A Hugging Face tokenizer by hub name or local folder; it must have the BERT-style special tokens. A folder's
    tokenizer files are bounded in size, and no code that came with it is run (trust_remote_code=False)."""
    if Path(name).expanduser().is_dir():
        refuse_links_outside(Path(name).expanduser(), f"data.tokenizer.kind={name}")
        check_tokenizer_files(Path(name).expanduser())
    try:
        tok = AutoTokenizer.from_pretrained(name, model_max_length=max_length, trust_remote_code=False)
    except (OSError, ValueError, RecursionError, TypeError, KeyError) as err:
        raise UserError(
            f"data.tokenizer.kind={name!r}: not a built-in kind ({', '.join(TOKENIZER_KINDS)}) and could not be "
            f"loaded as a Hugging Face tokenizer ({str(err).splitlines()[0]})"
        ) from None
    missing = [t for t in ("pad_token", "cls_token", "sep_token", "mask_token") if getattr(tok, t) is None]
    if missing:
        raise UserError(f"data.tokenizer.kind={name!r} lacks special tokens {missing}; MLM needs pad/cls/sep/mask")
    return tok


def _spaced_decoder(decoder):
    """A decoder that gives every word its leading space, as byte-level BPE tokens carry theirs: the
    text-generation pipeline appends decode(new tokens) to the prompt, which needs " word", not "word"."""
    if isinstance(decoder, decoders.WordPiece):
        prefix = re.escape(decoder.prefix)
        return decoders.Sequence([
            decoders.Replace(Regex(f"^(?!{prefix})"), " "),  # a word starts: a space before it
            decoders.Replace(Regex(f"^{prefix}"), ""),  # a word goes on: glued to the last piece
            decoders.Replace(Regex(r"^ (?=[.,?!]$)"), ""),  # no space before punctuation (WordPiece's cleanup)
        ])
    if isinstance(decoder, decoders.Metaspace):  # keep the first token's space instead of stripping it
        return decoders.Metaspace(replacement=decoder.replacement, prepend_scheme="never", split=decoder.split)
    return decoder  # byte-level: spaces are part of the tokens already


def for_generation(tokenizer: PreTrainedTokenizerFast) -> PreTrainedTokenizerFast:
    """The tokenizer a causal checkpoint ships. Training saw [CLS] then the token stream, each document closed by
    [SEP]; a prompt is the start of a document, so it gets [CLS] and no [SEP] (after one, the model would begin a
    new document). A pair keeps the [SEP] between its texts. Decoding spaces every word (`_spaced_decoder`). [CLS]
    and [SEP] are its bos and eos tokens."""
    with TemporaryDirectory() as tmp:  # a deep copy through the saved form, the one path every tokenizer has
        tokenizer.save_pretrained(tmp)
        tok = AutoTokenizer.from_pretrained(tmp)
    backend, cls, sep = tok.backend_tokenizer, tok.cls_token, tok.sep_token
    backend.post_processor = processors.TemplateProcessing(
        single=f"{cls} $A", pair=f"{cls} $A {sep} $B:1", special_tokens=[(cls, tok.cls_token_id), (sep, tok.sep_token_id)]
    )
    backend.decoder = _spaced_decoder(backend.decoder)
    # What tools for causal LMs read (lm-eval's prefix token and end of text, generation's stop): a document
    # starts with [CLS] and ends with [SEP].
    tok.bos_token, tok.eos_token = cls, sep
    return tok


def _space_marker(pre_tokenizer) -> str | None:
    """The character a pre-tokenizer puts at the start of a word: byte-level's "Ġ" (the space byte), Metaspace's
    replacement ("▁"), looked for through Sequence pre-tokenizers; None when it marks no word start."""
    if not pre_tokenizer:
        return None
    if pre_tokenizer["type"] == "Sequence":
        return next(filter(None, map(_space_marker, pre_tokenizer["pretokenizers"])), None)
    if pre_tokenizer["type"] == "ByteLevel":
        return "\u0120"
    if pre_tokenizer["type"] == "Metaspace":
        return pre_tokenizer.get("replacement") or pre_tokenizer.get("str_rep")
    return None


def word_starts(tokenizer, size: int) -> torch.Tensor:
    """starts_word[id] for every id below `size`: whether the token begins a word (train.masking=whole-word).
    WordPiece-style models mark the continuation ("##"), byte-level BPE and Metaspace (unigram) the word start
    ("Ġ", "▁"); special tokens are words of their own, ids the tokenizer lacks count as starts."""
    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    prefix = spec["model"].get("continuing_subword_prefix")
    marker = None if prefix else _space_marker(spec.get("pre_tokenizer"))
    if not prefix and not marker:
        raise UserError(f"train.masking='whole-word' is invalid: the tokenizer ({spec['model']['type']} model, "
                        "pre-tokenizer " + str((spec.get("pre_tokenizer") or {}).get("type")) + ") marks no word "
                        "boundaries (no continuation prefix like '##', no word-start marker like 'Ġ' or '▁'); "
                        "use train.masking=token or span")
    table = torch.ones(size, dtype=torch.bool)
    for token, index in tokenizer.get_vocab().items():
        if index < size:
            table[index] = not token.startswith(prefix) if prefix else token.startswith(marker)
    table[[i for i in tokenizer.all_special_ids if i < size]] = True
    return table
