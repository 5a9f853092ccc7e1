import pytest

from ngspec import staging
from ngspec.errors import NgspecError


def test_write_text_replaces_the_file_and_leaves_no_temporary(tmp_path):
    out = tmp_path / "shape.json"
    out.write_text("old")
    staging.write_text(out, "new")
    assert out.read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["shape.json"]


def test_an_interrupted_write_keeps_the_old_file(tmp_path, monkeypatch):
    out = tmp_path / "shape.json"
    out.write_text("old")

    def interrupted(self, text):
        raise KeyboardInterrupt

    monkeypatch.setattr(type(out), "write_text", interrupted)
    with pytest.raises(KeyboardInterrupt):
        staging.write_text(out, "new")
    monkeypatch.undo()
    assert out.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["shape.json"]


def test_output_directory_is_created_or_refused_clearly(tmp_path):
    staging.output_directory(tmp_path / "a" / "b" / "shape.json")
    assert (tmp_path / "a" / "b").is_dir()
    (tmp_path / "file").write_text("")
    with pytest.raises(NgspecError, match="cannot create the directory for"):
        staging.output_directory(tmp_path / "file" / "shape.json")


def test_output_paths_of_the_wrong_kind_are_refused_before_any_work(tmp_path):
    with pytest.raises(NgspecError, match="is a directory; give the path of a file"):
        staging.output_directory(tmp_path)  # e.g. --json-out DIR: refused before the bench runs
    afile = tmp_path / "notes.txt"
    afile.write_text("keep me")
    with pytest.raises(NgspecError, match="is a file; --force replaces a directory only"):
        with staging.staged_directory(afile, force=True):
            pytest.fail("no work starts")
    assert afile.read_text() == "keep me" and sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]
