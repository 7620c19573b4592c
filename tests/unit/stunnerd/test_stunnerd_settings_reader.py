"""stunnerd's own settings reader: `STUNNERD_*` variables read as pydantic-settings reads them.

The other services read their settings with pydantic-settings; stunnerd reads its into frozen
dataclasses so that the dataplane never loads it (docs/scale.md, section 3). These tables pin the
conventions the two share: names without regard to case, empty variables as unset, pydantic's
spellings of booleans and numbers, flags over the environment, and one-line errors that name each
setting and never show the value.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any

import pytest
from annotated_types import Ge as ForeignGe

from stunnerd.app import EXIT_CONFIG
from stunnerd.bounds import Ge, Interval
from stunnerd.cli import main
from stunnerd.settings import SETTINGS, Setting, SettingsError, StunnerdSettings, load_settings
from support.fresh import modules_after

URI = "turn://u:p@127.0.0.1:3478"


def env_settings(env: dict[str, str], **flags: Any) -> StunnerdSettings:
    """The settings of a stunnerd started with `env` and `flags`."""
    return load_settings(env, config=None, watch=False, turn_uri=None, ident="a/b", **flags)


def refusal(env: dict[str, str], **flags: Any) -> str:
    with pytest.raises(SettingsError) as caught:
        env_settings(env, **flags)
    return str(caught.value)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("true", True),
        ("TRUE", True),
        ("t", True),
        ("Y", True),
        ("yes", True),
        ("On", True),
        ("1", True),
        ("false", False),
        ("No", False),
        ("off", False),
        ("F", False),
        ("n", False),
        ("0", False),
    ],
)
def test_a_boolean_takes_pydantics_spellings_in_any_case(text: str, value: bool) -> None:
    assert env_settings({"STUNNERD_WORKER_JOURNAL": text}).worker_journal is value


@pytest.mark.parametrize("text", ["2", " true", "true ", "sometimes", "enabled"])
def test_any_other_boolean_is_refused_by_name(text: str) -> None:
    assert refusal({"STUNNERD_WORKER_JOURNAL": text}) == (
        "worker_journal: Input should be a valid boolean, unable to interpret input"
    )


@pytest.mark.parametrize(
    ("text", "value"), [("3", 3), (" 3 ", 3), ("+3", 3), ("1_0", 10), ("3.0", 3), ("03", 3)]
)
def test_an_integer_takes_pydantics_spellings(text: str, value: int) -> None:
    assert env_settings({"STUNNERD_UDP_THREAD_NUM": text}).udp_thread_num == value


@pytest.mark.parametrize("text", ["1.5", "1e3", "0x10", "three", "\uff13", "3."])
def test_an_integer_that_is_not_whole_is_refused(text: str) -> None:
    assert refusal({"STUNNERD_UDP_THREAD_NUM": text}) == (
        "udp_thread_num: Input should be a valid integer, unable to parse string as an integer"
    )


@pytest.mark.parametrize(
    ("text", "value"), [("1.5", 1.5), ("2", 2.0), (" 0.25 ", 0.25), ("1e1", 10.0), ("1_0", 10.0)]
)
def test_a_number_takes_integers_and_decimals(text: str, value: float) -> None:
    assert env_settings({"STUNNERD_GRACE_PERIOD_S": text}).grace_period_s == value


@pytest.mark.parametrize("text", ["1,5", "soon", "\uff11"])
def test_a_number_that_does_not_parse_is_refused(text: str) -> None:
    assert refusal({"STUNNERD_GRACE_PERIOD_S": text}) == (
        "grace_period_s: Input should be a valid number, unable to parse string as a number"
    )


@pytest.mark.parametrize(
    ("setting", "text", "problem"),
    [
        ("grace_period_s", "-1", "greater than or equal to 0"),
        ("dns_timeout_s", "0", "greater than 0"),
        ("dns_timeout_s", "nan", "greater than 0"),
        ("health_port", "65536", "less than or equal to 65535"),
        ("max_stun_message_bytes", "547", "greater than or equal to 548"),
        ("log_format", "JSON", "'text' or 'json'"),
        ("health_port", "None", "a valid integer, unable to parse string as an integer"),
    ],
)
def test_bounds_and_choices_are_checked(setting: str, text: str, problem: str) -> None:
    env = {f"STUNNERD_{setting.upper()}": text}
    assert refusal(env) == f"{setting}: Input should be {problem}"


def test_an_optional_text_takes_none_as_text() -> None:
    assert env_settings({"STUNNERD_LOG_SPEC": "None"}).log_spec == "None"
    assert env_settings({"STUNNERD_HEALTH_PORT": "8080"}).admin.health_port == 8080


def test_variable_names_are_read_without_regard_to_case() -> None:
    assert env_settings({"stunnerd_bind_host": "127.0.0.1"}).bind_host == "127.0.0.1"
    assert env_settings({"Stunnerd_Bind_Host": "127.0.0.2"}).bind_host == "127.0.0.2"


def test_an_empty_variable_is_unset_and_never_unsets_another_spelling() -> None:
    assert env_settings({"STUNNERD_GRACE_PERIOD_S": ""}).grace_period_s == 3600.0
    env = {"STUNNERD_BIND_HOST": "10.0.0.1", "stunnerd_bind_host": ""}
    assert env_settings(env).bind_host == "10.0.0.1"


def test_variables_that_name_no_setting_are_ignored() -> None:
    env = {"STUNNERD_NO_SUCH_SETTING": "x", "STUNNERD_TUNING": "{}", "STUNNERD_CDS_TOKEN": "t"}
    settings = env_settings(env)
    assert (settings.tuning, settings.cds_token) == (env_settings({}).tuning, None)


def test_a_flag_beats_the_environment_and_is_checked_as_a_variable_is() -> None:
    assert env_settings({"STUNNERD_BIND_HOST": "10.0.0.1"}, bind_host="127.0.0.1").bind_host == (
        "127.0.0.1"
    )
    assert refusal({"STUNNERD_GRACE_PERIOD_S": "7"}, grace_period_s=-1.0) == (
        "grace_period_s: Input should be greater than or equal to 0"
    )


def test_every_problem_is_told_on_one_line_in_the_order_of_the_settings() -> None:
    message = refusal({"STUNNERD_QUOTA_REPLICAS": "0", "STUNNERD_WORKER_JOURNAL": "maybe"})
    assert message == (
        "worker_journal: Input should be a valid boolean, unable to interpret input; "
        "quota_replicas: Input should be greater than or equal to 1"
    )


def test_the_rejected_value_is_never_in_the_message() -> None:
    env = {"STUNNERD_QUOTA_REDIS_URL": "redis://:pw@h:6379/0", "STUNNERD_QUOTA_REPLICAS": "pw"}
    message = refusal(env)
    assert message.startswith("quota_replicas: ")
    assert "pw" not in message.removeprefix("quota_replicas: ")


def test_a_settings_error_is_a_value_error() -> None:
    assert issubclass(SettingsError, ValueError)


@pytest.mark.parametrize(
    ("argv", "env", "line"),
    [
        (
            [URI],
            {"STUNNERD_WORKER_JOURNAL": "x"},
            "stunnerd: invalid settings: worker_journal: Input should be a valid boolean, "
            "unable to interpret input\n",
        ),
        (
            ["--grace-period", "-1", URI],
            {},
            "stunnerd: invalid settings: grace_period_s: Input should be greater than or equal "
            "to 0\n",
        ),
    ],
)
def test_the_command_says_which_setting_is_wrong_and_exits(
    argv: list[str], env: dict[str, str], line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv, env) == EXIT_CONFIG
    assert capsys.readouterr().err == line


def test_a_copy_with_a_setting_replaced_keeps_the_environment() -> None:
    settings = load_settings(
        {"ONLY_HERE": "1"}, config="k8s", watch=True, turn_uri=None, ident="ns/gw"
    )
    copy = dataclasses.replace(settings, origin="http://127.0.0.1:1")
    assert (copy.origin, dict(copy.environ)) == ("http://127.0.0.1:1", {"ONLY_HERE": "1"})
    assert dataclasses.replace(copy, origin=settings.origin) == settings


def test_every_setting_is_one_the_reader_knows() -> None:
    assert {setting.kind for setting in SETTINGS.values()} == {bool, int, float, str}
    with pytest.raises(TypeError, match="unsupported"):
        Setting.of(Annotated[int, ForeignGe(2)], 0)
    with pytest.raises(TypeError, match="unsupported"):
        Setting.of(list[int], [])
    assert Setting.of(Annotated[int, Ge(1)] | None, None).value("2") == 2
    bounded = Setting.of(Annotated[int, Interval(gt=0, le=10)], 1)
    assert bounded.value("10") == 10
    with pytest.raises(ValueError, match="greater than 0"):
        bounded.value("0")
    with pytest.raises(ValueError, match="less than or equal to 10"):
        bounded.value(11)


CHILD = """
from stunnerd.settings import load_settings
import stunnerd.cli
settings = load_settings(
    {"STUNNERD_BIND_HOST": "127.0.0.1", "STUNNERD_WORKER_JOURNAL": "off"},
    config=None, watch=False, turn_uri=None, ident="a/b",
)
assert (settings.bind_host, settings.worker_journal) == ("127.0.0.1", False)
"""


def test_reading_the_settings_loads_no_pydantic_settings() -> None:
    modules = modules_after(CHILD)
    assert "stunnerd.cli" in modules
    assert {"pydantic_settings", "stunner_common.process_settings"} & modules == set()
