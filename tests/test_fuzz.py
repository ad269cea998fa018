"""A bounded, seeded mutation-fuzzing run over every reader (``bench/fuzz.py`` runs longer)."""

from __future__ import annotations

from fixtures.fuzz import corpus_seeds, fuzz, run_case, seeds

CASES = 140  # 20 per reader seed; each runs in a forked child with time and memory bounds


def test_every_seed_reads(fx, tmp_path):
    for seed in seeds(fx, tmp_path / "seeds"):
        assert run_case(seed.root) is None, seed.name


def test_mutated_inputs_never_escape_the_error_family(fx, tmp_path):
    found = [f for _, f in fuzz(seeds(fx, tmp_path / "seeds"), CASES, tmp_path / "crashes")
             if f is not None]
    assert found == [], "\n\n".join(f"{f.seed} case {f.case}: {f.kind}\n{f.detail}"
                                    for f in found[:3])


def test_every_hostile_corpus_file_behaves(corpus):
    """The fuzzer's other seeds: each attack is refused or read, never anything else."""
    for case in corpus.values():
        assert run_case(case.path) is None, case.name


def test_mutated_attacks_never_escape_the_error_family(corpus, tmp_path, sentinel):
    attack_seeds = corpus_seeds({name: case.path for name, case in corpus.items()})
    assert len(attack_seeds) >= 100
    found = [f for _, f in fuzz(attack_seeds, 100, tmp_path / "crashes", rng_seed=7)
             if f is not None]
    assert found == [], "\n\n".join(f"{f.seed} case {f.case}: {f.kind}\n{f.detail}"
                                    for f in found[:3])
    assert not sentinel.exists()


def test_past_fuzz_findings_stay_fixed(fx, tmp_path):
    """Inputs the fuzzer once broke a reader with (corrupted fixtures, nothing executable).

    A ``*.metadata`` case is a DCP folder's metadata file: it replaces the
    metadata of a valid DCP folder.
    """
    import shutil
    from pathlib import Path

    import ckptport

    dcp_folder = tmp_path / "dcp"
    ckptport.normalize_file(fx["ddp_cuda3"], dcp_folder, to="dcp")
    corpus = sorted((Path(__file__).parent / "corpus").iterdir())
    assert corpus
    for case in corpus:
        target = case
        if case.suffix == ".metadata":
            shutil.copy(case, dcp_folder / ".metadata")
            target = dcp_folder
        assert run_case(target) is None, case.name
