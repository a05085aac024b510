"""Single sign-on's configuration: the client secret's file, the group mapping, and sealed refresh tokens."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.control.sso import seal
from llmgw.control.sso.config import GroupMapping, mapping_of, read_secret
from llmgw.core.errors import LlmgwError
from llmgw.serving.settings import ServerSettings


def test_secret_file_readable_by_others_is_refused_without_showing_it(tmp_path: Path) -> None:
    f = tmp_path / "secret"
    f.write_text("s3cret\n")
    for mode in (0o640, 0o604, 0o660):
        f.chmod(mode)
        with pytest.raises(LlmgwError) as e:
            read_secret(f)
        assert f"(mode {mode:04o})" in str(e.value) and f"chmod 600 {f}" in str(e.value)
        assert "s3cret" not in str(e.value)
    f.chmod(0o600)
    assert read_secret(f) == "s3cret"
    f.write_text("\n")
    with pytest.raises(LlmgwError, match="is empty"):
        read_secret(f)


def test_mapping_flags_and_file(tmp_path: Path) -> None:
    f = tmp_path / "map.yaml"
    f.write_text("roles: {ops: operator, staff: viewer}\n"
                 "projects: {team-a: {a: owner}, staff: {a: viewer, b: member}}\n")
    m = mapping_of(["admins=admin", "staff=operator"], ["team-b=b:owner", "all=c"], f)
    assert m.roles == {"ops": "operator", "staff": "operator", "admins": "admin"}  # the flag wins on staff
    assert m.role_of(["staff", "admins"]) == "admin" and m.role_of(["nobody"]) == ""
    assert m.projects_of(["staff", "team-a"]) == {"a": "owner", "b": "member"}
    assert m.projects_of(["all"]) == {"c": "member"}
    assert GroupMapping().role_of(["x"]) == ""


@pytest.mark.parametrize(("roles", "projects", "words"), [
    (["admins"], [], "expected GROUP=ROLE"),
    (["admins=root"], [], "role 'root' is not one of viewer, operator, admin"),
    ([], ["team=a:boss"], "project role 'boss' is not one of viewer, member, owner"),
    ([], ["team"], "expected GROUP=PROJECT[:ROLE]"),
])
def test_bad_mappings_name_the_flag(roles: list[str], projects: list[str], words: str) -> None:
    with pytest.raises(LlmgwError) as e:
        mapping_of(roles, projects, None)
    assert words in str(e.value) and "--sso-" in str(e.value)


def test_server_settings_need_the_whole_client() -> None:
    with pytest.raises(ValueError, match="--sso-issuer needs --sso-client-id and --sso-client-secret-file"):
        ServerSettings(sso_issuer="https://idp.example.com")
    with pytest.raises(ValueError, match="--sso-client-id needs --sso-issuer"):
        ServerSettings(sso_client_id="llmgw")
    with pytest.raises(ValueError, match="must include openid"):
        ServerSettings(sso_issuer="https://i", sso_client_id="c", sso_client_secret_file=Path("/x"), sso_scopes="email")
    with pytest.raises(ValueError, match="--sso-refresh-interval"):
        ServerSettings(sso_refresh_interval="0s")


def test_sealed_refresh_token_opens_only_with_the_same_secret() -> None:
    sealed = seal.seal("secret-1", "refresh-token-value")
    assert "refresh-token-value" not in sealed and sealed.startswith("v1.")
    assert seal.open_sealed("secret-1", sealed) == "refresh-token-value"
    assert seal.open_sealed("secret-2", sealed) == ""
    assert seal.seal("secret-1", "") == "" and seal.open_sealed("secret-1", "") == ""
