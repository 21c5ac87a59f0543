"""What a command reads is checked before any model loads (headprune.cli.inputs): a typo'd model name gets a
"did you mean" from the known names without asking the hub, a missing --scores / --curves / --pairs file, corpus
path or pruned folder is one line on stderr, and ``headprune`` alone lists the commands."""

import pytest

import headprune.io.read.loading
from headprune.cli.main import COMMANDS, command_module, main
from headprune.errors import HeadpruneError


@pytest.fixture
def nothing_loads(monkeypatch):
    """Loading a model or asking the hub fails the test."""
    import huggingface_hub

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded or the hub asked before the input was refused")

    monkeypatch.setattr(headprune.io.read.loading, "load_model", refuse)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", refuse)


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("headprune: error: "), err
    return err[0]


@pytest.mark.parametrize("name, meant", [("stdlib-gpt2-mimi", "'stdlib-gpt2-mini'"), ("gtp2", "'gpt2'"),
                                         ("GPT2", "'gpt2'"), ("smollm2-135m-instrut", "'smollm2-135m-instruct'")])
@pytest.mark.parametrize("command", [["eval"], ["score", "--methods", "grad", "--out", "s.csv"],
                                     ["anatomy", "--out", "a"], ["run", "--out", "r"],
                                     ["finetune", ".", "--steps", "1", "--out", "f", "--teacher"]])
def test_a_typod_model_name_says_did_you_mean(name, meant, command, tmp_path, monkeypatch, capsys, nothing_loads):
    monkeypatch.chdir(tmp_path)
    flag = [] if command[-1] == "--teacher" else ["--model"]
    assert main([*command, *flag, name]) == 2
    assert f"model {name!r} is not a shipped, packaged or known hub model; did you mean {meant}?" in \
        one_error_line(capsys)
    assert list(tmp_path.iterdir()) == []


def test_the_loader_says_it_too_and_lets_real_names_through(tiny_dir):
    from headprune.io.read.model_names import check_model_source

    with pytest.raises(HeadpruneError, match="did you mean 'gpt2'"):
        headprune.io.read.loading.load_model("gtp2")
    for name in ("gpt2", "stdlib-gpt2-mini", "openai-community/gpt2", "an-org/gtp2", "unrelated-name", str(tiny_dir)):
        check_model_source(name)  # known, an owner/name hub id, close to nothing, or a folder: the loader tries it


def test_a_missing_model_folder_names_a_close_one(tmp_path, monkeypatch, capsys, nothing_loads):
    (tmp_path / "pruned").mkdir()
    assert main(["eval", "--model", str(tmp_path / "pruend")]) == 2
    assert f"does not exist; did you mean {tmp_path / 'pruned'}?" in one_error_line(capsys)
    monkeypatch.chdir(tmp_path)  # owner/name where owner is a local folder: a path, not a hub id
    assert main(["eval", "--model", "pruned/model"]) == 2
    assert "model directory 'pruned/model' does not exist" in one_error_line(capsys)


@pytest.mark.parametrize("argv, words", [
    (["prune", "--scores", "missing.csv", "--method", "grad", "--fraction", "0.3", "--out", "p"],
     "--scores missing.csv: does not exist"),
    (["prune", "--scores", "folder", "--method", "grad", "--fraction", "0.3", "--out", "p"],
     "--scores folder: is a folder, not a file"),
    (["curve", "--scores", "missing.csv", "--methods", "grad", "--out", "c.csv"], "--scores missing.csv: does not"),
    (["report", "--scores", "missing.csv", "--curves", "c.csv", "--out", "r"], "--scores missing.csv: does not"),
    (["patch", "--pairs", "missing.jsonl", "--out", "p.csv"], "--pairs missing.jsonl: does not exist"),
    (["eval", "--data", "missing.txt"], "corpus path missing.txt does not exist"),
    (["curve", "--scores", "s.csv", "--methods", "grad", "--score-data", "missing.txt", "--out", "c.csv"],
     "corpus path missing.txt does not exist"),
    (["finetune", "missing", "--steps", "1", "--out", "f"], "PRUNED_DIR missing: no such folder"),
    (["finetune", "folder", "--steps", "1", "--out", "f", "--train-data", "missing.txt"], "corpus path missing.txt"),
])
def test_a_missing_input_is_refused_before_the_model_loads(argv, words, tmp_path, monkeypatch, capsys,
                                                             nothing_loads):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "folder").mkdir()
    (tmp_path / "s.csv").write_text("layer,head\n")
    assert main(argv) == 2
    assert words in one_error_line(capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder", "s.csv"]  # nothing written


def test_headprune_alone_lists_the_commands_one_line_each(capsys):
    assert main([]) == 0
    lines = capsys.readouterr().out.splitlines()
    for name in COMMANDS:
        line = next(x for x in lines if x.split()[:1] == [name])
        assert line.endswith(command_module(name).HELP)
    assert lines[-1].startswith("Run headprune COMMAND --help")
