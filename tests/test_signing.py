"""Signed weights: ``sign`` and ``verify`` against OpenSSF's real ``model_signing``.

Interop both ways (ckptport signs, model_signing verifies; model_signing signs,
ckptport verifies), a conversion that breaks the OMS file signature while the
weights attestation still verifies, every bad input the issue lists (exit 1
or 2 naming the cause, never a pass), and a remote source read for its
tensors only. Keys and certificates are made here with ``cryptography``.
"""

from __future__ import annotations

import base64
import datetime
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import ckptport
from ckptport.signing import SigningKey, TrustedKeys, sign, verify

model_signing = pytest.importorskip("model_signing")
pytest.importorskip("OpenSSL")
from cryptography import x509  # noqa: E402 (after the skip: an extra of its own)
from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.x509.oid import NameOID  # noqa: E402

DAY = datetime.timedelta(days=1)


def _pem_key(key: ec.EllipticCurvePrivateKey, path: Path) -> Path:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    return path


def _pem_public(key: ec.EllipticCurvePrivateKey, path: Path) -> Path:
    path.write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return path


def _certificate(path: Path, subject: str, key: ec.EllipticCurvePrivateKey,
                 issuer: tuple[str, ec.EllipticCurvePrivateKey] | None, *, ca: bool,
                 signing: bool = True, start: datetime.datetime | None = None,
                 days: int = 30) -> Path:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    issuer_name, issuer_key = (name, key) if issuer is None else (
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer[0])]), issuer[1])
    start = start or datetime.datetime.now(datetime.timezone.utc) - DAY
    made = (x509.CertificateBuilder().subject_name(name).issuer_name(issuer_name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(start).not_valid_after(start + days * DAY)
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(
                digital_signature=signing and not ca, content_commitment=False,
                key_encipherment=not signing and not ca, data_encipherment=False,
                key_agreement=False, key_cert_sign=ca, crl_sign=ca, encipher_only=False,
                decipher_only=False), critical=True))
    path.write_bytes(made.sign(issuer_key, hashes.SHA256()).public_bytes(
        serialization.Encoding.PEM))
    return path


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A signing key pair, a stranger's key, a root with a leaf that may sign, a leaf that
    may not, a leaf long expired, and a root nothing chains to."""
    folder = tmp_path_factory.mktemp("pki")
    key, other, root_key, stranger = (ec.generate_private_key(ec.SECP256R1())
                                      for _ in range(4))
    root = ("ckptport test root", root_key)
    old = datetime.datetime(2020, 1, 1, tzinfo=datetime.timezone.utc)
    return {
        "key": _pem_key(key, folder / "key.pem"), "pub": _pem_public(key, folder / "pub.pem"),
        "other-pub": _pem_public(other, folder / "other.pub.pem"),
        "root": _certificate(folder / "root.pem", root[0], root_key, None, ca=True),
        "leaf": _certificate(folder / "leaf.pem", "release signer", key, root, ca=False),
        "no-usage": _certificate(folder / "nosign.pem", "not a signer", key, root, ca=False,
                                 signing=False),
        "expired": _certificate(folder / "expired.pem", "2020 signer", key, root, ca=False,
                                start=old, days=2),
        "old-root": _certificate(folder / "oldroot.pem", root[0], root_key, None, ca=True,
                                 start=old, days=3650 * 3),
        "stranger-root": _certificate(folder / "stranger.pem", "stranger", stranger, None,
                                      ca=True),
    }


@pytest.fixture(scope="session")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A model folder (weights, config), a lone file, and the folder converted to .pth."""
    folder = tmp_path_factory.mktemp("models")
    torch.manual_seed(0)
    state = {"embed.weight": torch.randn(8, 4), "norm.weight": torch.ones(4),
             "proj.weight": torch.randn(4, 4)}
    hub = folder / "release"
    hub.mkdir()
    save_file(state, str(hub / "model.safetensors"))
    (hub / "config.json").write_text(json.dumps({"model_type": "toy"}))
    single = folder / "single.safetensors"
    save_file(state, str(single))
    other = folder / "other.safetensors"
    save_file({**state, "norm.weight": torch.full((4,), 2.0)}, str(other))
    return {"folder": hub, "file": single, "other": other, "state_dir": folder}


def _key(pki: dict[str, Path], **kwargs: object) -> SigningKey:
    return SigningKey(pki["key"], **kwargs)  # type: ignore[arg-type]


@pytest.fixture(scope="session")
def signed(models, pki, tmp_path_factory) -> dict[str, Path]:
    """The release folder signed by ckptport (key), and a copy signed with a certificate."""
    sign(models["folder"], _key(pki))
    cert = tmp_path_factory.mktemp("cert") / "release"
    cert.mkdir()
    (cert / "model.safetensors").write_bytes((models["folder"] / "model.safetensors")
                                             .read_bytes())
    sign(cert, _key(pki, certificate=pki["leaf"], chain=(pki["root"],)))
    return {"key": models["folder"], "cert": cert}


def test_ckptport_signs_and_model_signing_verifies(signed, pki):
    folder = signed["key"]
    assert {p.name for p in folder.iterdir()} >= {"model.sig", "model.weights.sig"}
    model_signing.verifying.Config().use_elliptic_key_verifier(public_key=pki["pub"]).verify(
        folder, folder / "model.sig")
    model_signing.verifying.Config().use_certificate_verifier(
        certificate_chain=[pki["root"]]).verify(signed["cert"], signed["cert"] / "model.sig")
    with pytest.raises(ValueError):  # it checks the key: a stranger's does not verify it
        model_signing.verifying.Config().use_elliptic_key_verifier(
            public_key=pki["other-pub"]).verify(folder, folder / "model.sig")


def test_the_model_signing_cli_verifies_a_file_ckptport_signed(models, pki, tmp_path):
    from click.testing import CliRunner
    from model_signing._cli import main as model_signing_cli

    single = tmp_path / models["file"].name
    single.write_bytes(models["file"].read_bytes())
    sign(single, _key(pki))
    result = CliRunner().invoke(model_signing_cli, [
        "verify", "key", str(single), "--signature", f"{single}.sig",
        "--public_key", str(pki["pub"])])
    assert result.exit_code == 0 and "Verification succeeded" in result.output, result.output


def test_model_signing_signs_and_ckptport_verifies(models, pki, tmp_path, run):
    folder = tmp_path / "theirs"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(models["file"].read_bytes())
    model_signing.signing.Config().use_elliptic_key_signer(private_key=pki["key"]).sign(
        folder, tmp_path / "theirs.sig")
    model_signing.signing.Config().use_certificate_signer(
        private_key=pki["key"], signing_certificate=pki["leaf"],
        certificate_chain=[pki["root"]]).sign(folder, tmp_path / "theirs-cert.sig")
    result = run("verify", folder, "--signature", tmp_path / "theirs.sig",
                 "--public-key", pki["pub"])
    assert result.exit_code == 0, result.output
    assert "files: the 1 files match" in result.stdout
    result = run("verify", folder, "--signature", tmp_path / "theirs-cert.sig",
                 "--certificate-chain", pki["root"])
    assert result.exit_code == 0, result.output
    (folder / "model.safetensors").write_bytes(models["other"].read_bytes())
    result = run("verify", folder, "--signature", tmp_path / "theirs.sig",
                 "--public-key", pki["pub"])
    assert result.exit_code == 1 and "changed model.safetensors" in result.stdout


def test_a_conversion_fails_the_files_and_keeps_the_weights(signed, pki, tmp_path, run):
    release = signed["key"]
    converted = tmp_path / "converted"
    converted.mkdir()
    ckptport.normalize_file(release / "model.safetensors", converted / "pytorch_model.bin")
    ckptport.normalize_file(release / "model.safetensors", tmp_path / "shards",
                            max_shard_size=64)
    with pytest.raises(ValueError, match="mismatch"):  # the OMS signature is over files
        model_signing.verifying.Config().use_elliptic_key_verifier(
            public_key=pki["pub"]).verify(converted, release / "model.sig")
    for target in (converted, tmp_path / "shards"):
        result = run("verify", target, "--signature", release / "model.sig",
                     "--public-key", pki["pub"])
        assert result.exit_code == 0, result.output
        assert "files: differ" in result.stdout and "weights: the 3 tensors match" in \
            result.stdout and "the weights are the signed weights" in result.stdout


def test_other_weights_are_named_tensor_by_tensor(signed, models, pki, run):
    result = run("verify", models["other"], "--signature",
                 signed["key"] / "model.weights.sig", "--public-key", pki["pub"])
    assert result.exit_code == 1
    assert "different norm.weight: content" in result.stdout


def test_an_expired_certificate_keeps_verifying(models, pki, tmp_path, run):
    single = tmp_path / "old.safetensors"
    single.write_bytes(models["file"].read_bytes())
    sign(single, _key(pki, certificate=pki["expired"], chain=(pki["old-root"],)))
    result = run("verify", single, "--certificate-chain", pki["old-root"])
    assert result.exit_code == 0, result.output  # judged as of the leaf's start, as OMS does


def _tampered(source: Path, target: Path, edit) -> Path:
    bundle = json.loads(source.read_text())
    statement = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))
    edit(statement)
    bundle["dsseEnvelope"]["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    target.write_text(json.dumps(bundle))
    return target


class _Raw:
    """Any JSON as the statement model_signing's signer signs (a protobuf Struct)."""

    def __init__(self, doc: dict) -> None:
        from google.protobuf import struct_pb2

        self.pb = struct_pb2.Struct()
        self.pb.update(doc)


def _signed_statement(pki, source: Path, target: Path, edit) -> Path:
    """A statement edited and then validly signed: only its content can be caught."""
    from model_signing._signing import sign_ec_key

    statement = json.loads(base64.b64decode(json.loads(source.read_text())
                                            ["dsseEnvelope"]["payload"]))
    edit(statement)
    payload = type("Payload", (), {"statement": _Raw(statement)})()
    target.write_text(sign_ec_key.Signer(pki["key"]).sign(payload).bundle.to_json())
    return target


def _lie_about(statement):
    entry = next(t for t in statement["predicate"]["tensors"] if t["name"] == "proj.weight")
    entry["sha256"] = "0" * 64


def _lie_and_recount(statement):  # the lie with a subject digest that matches it
    from ckptport.analysis.manifests import TensorEntry, weights_digest

    _lie_about(statement)
    entries = [TensorEntry(t["name"], t["dtype"], tuple(int(n) for n in t["shape"]),
                           int(t["nbytes"]), t["sha256"]) for t in statement["predicate"]
               ["tensors"]]
    statement["predicate"]["digest"] = weights_digest(entries)
    statement["subject"][0]["digest"]["sha256"] = weights_digest(entries)


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


BAD = {
    "tampered statement": (2, "does not verify", lambda s, p, t: _tampered(
        s / "model.weights.sig", t, lambda st: st["predicate"]["tensors"].pop())),
    "unknown bundle field": (2, "not a Sigstore bundle", lambda s, p, t: _write(
        t, json.dumps({**json.loads((s / "model.sig").read_text()), "extra": 1}))),
    "unknown statement field": (2, "unknown field", lambda s, p, t: _signed_statement(
        p, s / "model.weights.sig", t, lambda st: st.update(comment="trust me"))),
    "unknown predicate field": (2, "unknown field predicate.note", lambda s, p, t:
                                _signed_statement(p, s / "model.weights.sig", t,
                                                  lambda st: st["predicate"].update(note=1))),
    "digest not its tensors": (2, "does not match its tensors", lambda s, p, t:
                               _signed_statement(p, s / "model.weights.sig", t, _lie_about)),
    "subject not the digest": (2, "is not the digest of the tensors", lambda s, p, t:
                               _signed_statement(p, s / "model.weights.sig", t,
                                                 lambda st: st["subject"][0]["digest"].update(
                                                     sha256="1" * 64))),
    "predicate lying about tensors": (1, "different proj.weight", lambda s, p, t:
                                      _signed_statement(p, s / "model.weights.sig", t,
                                                        _lie_and_recount)),
    "not a bundle": (2, "not a Sigstore bundle", lambda s, p, t: _write(t, "{}")),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_signatures_never_pass(case, signed, pki, tmp_path, run):
    code, words, make = BAD[case]
    bad = make(signed["key"], pki, tmp_path / "bad.sig")
    result = run("verify", signed["key"], "--signature", bad, "--public-key", pki["pub"])
    assert result.exit_code == code, result.output
    assert words in (result.stderr if code == 2 else result.stdout), result.output


@pytest.mark.parametrize(("signer", "trusted", "words"), [
    ("key", ("--public-key", "other-pub"), "Key mismatch"),
    ("cert", ("--certificate-chain", "stranger-root"), "self-signed certificate"),
    ("cert", ("--public-key", "pub"), "does not verify"),
])
def test_wrong_keys_and_chains_are_refused(signer, trusted, words, signed, pki, run):
    result = run("verify", signed[signer], "--signature", signed[signer] / "model.sig",
                 trusted[0], pki[trusted[1]])
    assert result.exit_code == 2 and words in result.stderr, result.output
    assert str(signed[signer] / "model.sig") in result.stderr


def test_a_certificate_that_may_not_sign_is_refused(models, pki, tmp_path, run):
    single = tmp_path / "m.safetensors"
    single.write_bytes(models["file"].read_bytes())
    sign(single, _key(pki, certificate=pki["no-usage"], chain=(pki["root"],)))
    result = run("verify", single, "--certificate-chain", pki["root"])
    assert result.exit_code == 2 and "cannot be used for signing" in result.stderr


def test_a_signature_over_other_files(signed, models, pki, tmp_path, run):
    other = tmp_path / "other"
    other.mkdir()
    (other / "model.safetensors").write_bytes(models["other"].read_bytes())
    result = run("verify", other, "--signature", signed["key"] / "model.sig",
                 "--public-key", pki["pub"])
    assert result.exit_code == 1
    assert "changed model.safetensors" in result.stdout and "different norm.weight" in \
        result.stdout


def test_sign_refuses_to_overwrite_and_needs_a_key(models, pki, tmp_path, run):
    single = tmp_path / "m.safetensors"
    single.write_bytes(models["file"].read_bytes())
    assert run("sign", single, "--key", pki["key"]).exit_code == 0
    again = run("sign", single, "--key", pki["key"])
    assert again.exit_code == 2 and "exists" in again.stderr
    assert run("sign", single).exit_code == 2
    missing = run("sign", single, "--key", tmp_path / "none.pem", "--overwrite")
    assert missing.exit_code == 2 and "none.pem" in missing.stderr


def test_a_remote_source_is_verified_by_its_tensors(pki, tmp_path, run):
    from fixtures.servers import ObjectServer

    release = tmp_path / "release"
    release.mkdir()
    save_file({"w": torch.randn(256, 512), "b": torch.zeros(512)},
              str(release / "model.safetensors"))
    sign(release, _key(pki))
    size = (release / "model.safetensors").stat().st_size
    server = ObjectServer()
    try:
        server.objects["/model.safetensors"] = release / "model.safetensors"
        url = f"{server.url}/model.safetensors"
        result = run("verify", url, "--signature", release / "model.sig",
                     "--public-key", pki["pub"])
        assert result.exit_code == 0, result.output
        assert "not checked" in result.stdout and "weights: the 2 tensors match" in \
            result.stdout
        assert server.stats.bytes_sent < 1.5 * size  # the tensors once, and the header reads
        server.reset()
        remote_sig = tmp_path / "remote.sig"  # a remote source is signed by its weights only
        signed_there = run("sign", url, "--key", pki["key"], "-o", remote_sig)
        assert signed_there.exit_code == 0, signed_there.output
        assert not remote_sig.exists() and "its weights are signed" in signed_there.stdout
        assert server.stats.bytes_sent < 1.5 * size  # each tensor read once
        assert run("verify", release, "--signature", tmp_path / "remote.weights.sig",
                   "--public-key", pki["pub"]).exit_code == 0
        (release / "model.weights.sig").unlink()
        alone = run("verify", url, "--signature", release / "model.sig",
                    "--public-key", pki["pub"])
        assert alone.exit_code == 2 and "give its weights attestation" in alone.stderr
    finally:
        server.close()


def test_verify_from_python(signed, pki):
    report = verify(signed["key"], TrustedKeys(public_keys=(pki["pub"],)))
    assert report.exit_code == 0 and report.files is not None and report.files.same
    assert report.attestation is not None and report.weights is not None


@pytest.fixture(scope="session")
def chained(signed, pki, tmp_path_factory) -> dict[str, Path]:
    """The signed release converted by normalize --sign: renamed and cast, to .pth; and a
    second release it was not made from."""
    folder = tmp_path_factory.mktemp("chained")
    recipe = folder / "recipe.json"
    recipe.write_text(json.dumps({"steps": [{"rename": ["^embed\\.", "tok."]}]}))
    out = folder / "out.pth"
    report = ckptport.normalize_file(
        signed["key"], out, ckptport.NormalizeOptions(dtype="bfloat16", recipe=recipe),
        sign=_key(pki))
    assert report.attestation == folder / "out.pth.weights.sig"
    return {"out": out, "recipe": recipe, "folder": folder}


def test_normalize_sign_records_the_derivation(chained, pki, signed):
    from ckptport.signing.bundles import open_statement

    statement = open_statement(chained["out"].with_name("out.pth.weights.sig"),
                               TrustedKeys(public_keys=(pki["pub"],))).statement
    derivation = statement["predicate"]["derivation"]
    source = verify(signed["key"], TrustedKeys(public_keys=(pki["pub"],)))
    assert derivation["source"]["digest"] == source.attestation.manifest.digest
    assert [f["name"] for f in derivation["source"]["files"]] == ["model.safetensors"]
    assert derivation["options"]["dtype"] == "bfloat16"
    assert derivation["recipe_sha256"] == ckptport.NormalizeOptions(
        recipe=chained["recipe"]).loaded_recipe.sha256
    assert derivation["tool"].startswith("ckptport ")


def test_normalize_sign_with_hash_name_lies_beside_the_hashed_name(signed, pki, run, tmp_path):
    """``--hash-name`` names the file once hashed: the attestation lies beside that name,
    where ``verify`` looks, and one beside it already is refused before the file appears."""
    report = ckptport.normalize_file(signed["key"], tmp_path / "out.pth", hash_name=True,
                                     sign=_key(pki))
    final = Path(report.output.path)
    assert report.attestation == final.with_name(f"{final.name}.weights.sig")
    assert sorted(p.name for p in tmp_path.iterdir()) == [final.name, report.attestation.name]
    result = run("verify", final, "--public-key", pki["pub"])
    assert result.exit_code == 0, result.output
    final.unlink()
    again = run("normalize", signed["key"], tmp_path / "out.pth", "--hash-name", "--sign",
                pki["key"], "-q")
    assert again.exit_code == 2 and f"{report.attestation}: exists" in again.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [report.attestation.name]


def test_verify_chain_re_derives_the_output(chained, signed, pki, run, tmp_path):
    result = run("verify", chained["out"], "--chain", signed["key"], "--public-key", pki["pub"])
    assert result.exit_code == 0, result.output
    assert "re-derived: the 3 tensors are what the recorded options make" in result.stdout
    assert "tok.weight" not in result.stdout  # nothing differs
    # an output made otherwise, carrying the attestation of the one that was re-derived
    ckptport.normalize_file(signed["key"], tmp_path / "other.pth",
                            ckptport.NormalizeOptions(dtype="float16"))
    result = run("verify", tmp_path / "other.pth", "--chain", signed["key"], "--public-key",
                 pki["pub"], "--output-signature", chained["out"].with_name(
                     "out.pth.weights.sig"))
    assert result.exit_code == 1 and "different norm.weight: dtype float16" in result.stdout
    assert "missing tok.weight" in result.stdout and "extra embed.weight" in result.stdout


def test_verify_chain_needs_the_output_made_from_this_source(chained, models, pki, run,
                                                             tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "model.safetensors").write_bytes(models["other"].read_bytes())
    sign(other, _key(pki))
    result = run("verify", chained["out"], "--chain", other, "--public-key", pki["pub"])
    assert result.exit_code == 1
    assert "link: the output's derivation records the source" in result.stdout
    unsigned = tmp_path / "plain.pth"
    ckptport.normalize_file(other / "model.safetensors", unsigned)
    sign(unsigned, _key(pki))
    result = run("verify", unsigned, "--chain", other, "--public-key", pki["pub"])
    assert result.exit_code == 2 and "records no derivation" in result.stderr


def test_check_gates_on_the_signed_weights(signed, models, chained, pki, run, tmp_path):
    converted = tmp_path / "model.pth"
    ckptport.normalize_file(signed["key"], converted)
    result = run("check", converted, "--verify-signature", signed["key"] / "model.sig",
                 "--public-key", pki["pub"], "--format", "json")
    assert result.exit_code == 0, result.output
    result = run("check", models["other"], chained["out"], "--verify-signature",
                 signed["key"] / "model.weights.sig", "--public-key", pki["pub"],
                 "--codes", "CKP015")
    assert result.exit_code == 1
    assert "CKP015 [error] norm.weight: content changed" in result.stdout
    assert "CKP015 [error] embed.weight: missing" in result.stdout  # renamed in out.pth
    wrong = run("check", converted, "--verify-signature", signed["key"] / "model.sig",
                "--public-key", pki["other-pub"])
    assert wrong.exit_code == 2 and "Key mismatch" in wrong.stderr


def test_signing_reads_each_tensor_once(models, pki, tmp_path, monkeypatch, fx):
    """The read that hashes a file for the OMS signature hashes its tensors too: the
    manifest hashes none again, and the digests are the manifest's."""
    import ckptport.analysis.manifests as manifests

    hashed = []
    real = manifests._digest
    monkeypatch.setattr(manifests, "_digest", lambda leaf: hashed.append(leaf) or real(leaf))
    for name, source in (("m.safetensors", models["file"]), ("ddp.pth", fx["ddp_cuda3"])):
        single = tmp_path / name
        single.write_bytes(source.read_bytes())
        report = sign(single, _key(pki))
        assert hashed == [], name
        assert report.digest == ckptport.manifest(single).digest
        model_signing.verifying.Config().use_elliptic_key_verifier(
            public_key=pki["pub"]).verify(single, report.files_signature)
        hashed.clear()


def test_an_intermediate_certificate_chains_to_the_root(models, pki, tmp_path, run):
    root_key, middle_key = (ec.generate_private_key(ec.SECP256R1()) for _ in range(2))
    root = _certificate(tmp_path / "root.pem", "root", root_key, None, ca=True)
    middle = _certificate(tmp_path / "middle.pem", "middle", middle_key, ("root", root_key),
                          ca=True)
    signer_key = ec.generate_private_key(ec.SECP256R1())
    leaf = _certificate(tmp_path / "leaf.pem", "leaf", signer_key, ("middle", middle_key),
                        ca=False)
    single = tmp_path / "m.safetensors"
    single.write_bytes(models["file"].read_bytes())
    result = run("sign", single, "--key", _pem_key(signer_key, tmp_path / "leaf.key.pem"),
                 "--certificate", leaf, "--certificate-chain", middle)
    assert result.exit_code == 0, result.output
    assert run("verify", single, "--certificate-chain", root).exit_code == 0
    model_signing.verifying.Config().use_certificate_verifier(
        certificate_chain=[root]).verify(single, f"{single}.sig")
    assert run("verify", single, "--certificate-chain", pki["root"]).exit_code == 2


def test_blake3_file_signatures_verify_with_model_signings_api(models, pki, tmp_path):
    single = tmp_path / "m.safetensors"
    single.write_bytes(models["file"].read_bytes())
    sign(single, _key(pki), file_hash="blake3")
    assert json.loads(base64.b64decode(json.loads(Path(f"{single}.sig").read_text())
                                       ["dsseEnvelope"]["payload"]))["predicate"][
        "serialization"]["hash_type"] == "blake3"
    model_signing.verifying.Config().use_elliptic_key_verifier(public_key=pki["pub"]).verify(
        single, f"{single}.sig")
    assert verify(single, TrustedKeys(public_keys=(pki["pub"],))).files.same


def test_without_the_extra_signing_says_how_to_get_it(models, pki, tmp_path, monkeypatch, run):
    import sys

    monkeypatch.setitem(sys.modules, "model_signing._signing", None)
    single = tmp_path / "m.safetensors"
    single.write_bytes(models["file"].read_bytes())
    result = run("sign", single, "--key", pki["key"])
    assert result.exit_code == 2 and "pip install 'ckptport[sign]'" in result.stderr
