"""A checkpoint from elsewhere made into a model folder rollwire trains and serves (`rollwire model import`).

    import_gguf("SmolLM2-135M-Instruct.Q4_1.gguf", "models/smollm2")   # or a folder holding one .gguf

A GGUF file (llama.cpp's format: weights, often quantized, with the tokenizer and chat template
inside) is read by transformers (the `gguf` package), its weights dequantized. transformers marks
a model loaded that way as quantized and will not save it, so its weights go into a fresh model of
the same configuration, which saves as safetensors in float32 or bfloat16 beside the tokenizer, the
chat template and a generation config that ends at the end of a turn as well as at the end of text.
A tied output layer stays tied (one tensor on disk, as the source had it).

The weights are the dequantized values of the quantized file: a Q4_1 model imported in float32 is
that Q4_1 model exactly, not the original float checkpoint it was made from.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from rollwire.core.errors import ConfigError

DTYPES = ("float32", "bfloat16")


@dataclass(frozen=True)
class Imported:
    """What an import wrote, for the command to report."""

    folder: Path
    architecture: str
    layers: int
    hidden: int
    vocabulary: int
    parameters: int
    tied: bool
    dtype: str
    chat_template: bool
    end_of_turn: str | None
    bytes_written: int
    seconds: float

    @property
    def summary(self) -> str:
        return (f"{self.architecture}, {self.layers} layers, hidden {self.hidden}, vocabulary {self.vocabulary:,}, "
                f"{self.parameters / 1e6:.1f}M parameters ({'tied' if self.tied else 'untied'} embeddings), "
                f"{self.dtype}, {self.bytes_written / 2**20:.0f} MiB, chat template "
                f"{'with end of turn ' + repr(self.end_of_turn) if self.chat_template else 'none'}; {self.seconds:.0f} s")


def gguf_file(source: Path) -> Path:
    """The GGUF file `source` names: the file itself, or the only `.gguf` in a folder."""
    source = Path(source)
    if source.is_dir():
        found = sorted(source.glob("*.gguf"))
        if len(found) != 1:
            raise ConfigError(f"{source} holds {len(found)} .gguf files: name the one to import"
                              + (f" ({', '.join(p.name for p in found)})" if found else ""))
        return found[0]
    if not source.is_file():
        raise ConfigError(f"{source} does not exist: give a .gguf file or a folder holding one")
    if source.suffix != ".gguf":
        raise ConfigError(f"{source} is not a .gguf file (a safetensors folder needs no import: name it as the "
                          "recipe's model path)")
    return source


def import_gguf(source: Path | str, out: Path | str, *, dtype: str = "float32") -> Imported:
    """Writes the model of the GGUF file `source` (or the folder holding it) into the folder `out`."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from rollwire.trainer.model import quiet_transformers
    if dtype not in DTYPES:
        raise ConfigError(f"dtype {dtype!r}: pick one of {', '.join(DTYPES)}")
    started = time.perf_counter()
    path = gguf_file(Path(source))
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"{out} is not empty: import into a new folder (or remove it first)")
    folder, name = str(path.parent), path.name
    try:
        config = AutoConfig.from_pretrained(folder, gguf_file=name)
    except ImportError as exc:
        raise ConfigError(f"reading GGUF files needs the gguf package: pip install 'rollwire[trainer]' ({exc})") from exc
    except ValueError as exc:  # transformers: "GGUF model with architecture X is not supported yet."
        from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES
        raise ConfigError(f"{path.name}: {exc} transformers converts these GGUF architectures: "
                          f"{', '.join(sorted(GGUF_SUPPORTED_ARCHITECTURES))}") from exc
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    with quiet_transformers():
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
        tied = bool(getattr(config, "tie_word_embeddings", False))
        if tied:  # the tie makes the output layer's weight the embedding's: it is not missing
            missing = [k for k in missing if not k.endswith("lm_head.weight")]
            model.tie_weights()
        if missing or unexpected:
            raise ConfigError(f"{path.name}: the weights do not fit a {type(model).__name__} "
                              f"(missing {missing[:5]}, unexpected {unexpected[:5]})")
        model = model.to(torch_dtype)
        out.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(out, safe_serialization=True)
        tokenizer.save_pretrained(out)
    end_of_turn = _end_of_turn(tokenizer)
    eos = [tokenizer.eos_token_id] + ([tokenizer.convert_tokens_to_ids(end_of_turn)] if end_of_turn else [])
    GenerationConfig(bos_token_id=tokenizer.bos_token_id, eos_token_id=sorted(set(eos)),
                     pad_token_id=tokenizer.pad_token_id).save_pretrained(out)
    return Imported(folder=out, architecture=type(model).__name__, layers=config.num_hidden_layers,
                    hidden=config.hidden_size, vocabulary=config.vocab_size,
                    parameters=sum(p.numel() for p in model.parameters()), tied=tied, dtype=dtype,
                    chat_template=bool(tokenizer.chat_template), end_of_turn=end_of_turn,
                    bytes_written=sum(p.stat().st_size for p in out.iterdir() if p.is_file()),
                    seconds=time.perf_counter() - started)


def _end_of_turn(tokenizer) -> str | None:
    """The token the chat template closes an assistant turn with, where it is one token of the vocabulary."""
    if not tokenizer.chat_template:
        return None
    from rollwire.consumers.vllm_control import TURN_PROBE, turn_end
    user = [{"role": "user", "content": "hi"}]
    prefix = tokenizer.apply_chat_template(user, add_generation_prompt=True, tokenize=True, return_dict=False)
    full = tokenizer.apply_chat_template([*user, {"role": "assistant", "content": TURN_PROBE}], tokenize=True,
                                         return_dict=False)
    found = turn_end(prefix, full, tokenizer.encode(TURN_PROBE, add_special_tokens=False))
    return tokenizer.convert_ids_to_tokens(found[0]) if found else None
