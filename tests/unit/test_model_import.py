"""`rollwire model import`'s refusals, each naming what to change (the import of a real GGUF is in
tests/inference/test_real_model.py)."""

from __future__ import annotations

import numpy as np
import pytest

from rollwire.cli import main
from rollwire.core.errors import ConfigError
from rollwire.trainer.model_import import gguf_file, import_gguf


def test_a_source_that_names_no_single_gguf_file_is_refused_with_what_to_give(tmp_path):
    with pytest.raises(ConfigError, match="holds 0 .gguf files"):
        gguf_file(tmp_path)
    (tmp_path / "a.gguf").write_bytes(b"")
    (tmp_path / "b.gguf").write_bytes(b"")
    with pytest.raises(ConfigError, match=r"holds 2 .gguf files: name the one to import \(a.gguf, b.gguf\)"):
        gguf_file(tmp_path)
    assert gguf_file(tmp_path / "a.gguf") == tmp_path / "a.gguf"
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ConfigError, match="needs no import"):
        gguf_file(tmp_path / "model.safetensors")
    with pytest.raises(ConfigError, match="does not exist"):
        gguf_file(tmp_path / "missing.gguf")


def test_an_architecture_transformers_cannot_convert_is_refused_with_those_it_can(tmp_path):
    import gguf
    writer = gguf.GGUFWriter(str(tmp_path / "odd.gguf"), "made-up")
    writer.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ConfigError, match=r"made-up is not supported yet\. transformers converts these GGUF "
                                          r"architectures: .*llama.*qwen2"):
        import_gguf(tmp_path / "odd.gguf", tmp_path / "out")


def test_the_command_refuses_a_folder_that_is_not_empty_and_says_why(tmp_path, capsys):
    (tmp_path / "m.gguf").write_bytes(b"")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    assert main(["model", "import", str(tmp_path / "m.gguf"), "--out", str(tmp_path / "out")]) == 2
    assert "is not empty: import into a new folder" in capsys.readouterr().err
    assert (tmp_path / "out" / "keep.txt").read_text() == "mine"
