"""How a library error reads on the command line (``cli.errors.to_flags``): its leading parameter names
are written as the command's flags when the command has every one of them, and the message is left as
it is otherwise."""

from __future__ import annotations

from gradscope.cli.errors import to_flags


def test_leading_parameter_names_become_the_commands_flags() -> None:
    flags = {"--target-pos", "--probe-length", "--out", "-o"}
    assert to_flags("target_pos: got 40; valid positions are 1…31", flags) == \
        "--target-pos: got 40; valid positions are 1…31"
    assert to_flags("target_pos/probe_length: they set the lm study", flags) == \
        "--target-pos/--probe-length: they set the lm study"
    assert to_flags("out: s.zarr already exists; pass overwrite", flags) == \
        "--out: s.zarr already exists; pass overwrite"


def test_a_message_is_left_as_it_is_where_the_command_lacks_a_flag_or_it_names_none() -> None:
    flags = {"--target-pos", "--out"}
    for message in ("target_pos/probe_length: they set the lm study",  # no --probe-length here
                    "sv: got 0",  # not a flag of this command: the Python name stays
                    "checkpoint runs/a: does not exist",  # a sentence, not a parameter name
                    "Target_pos: got 40",
                    "no colon at all"):
        assert to_flags(message, flags) == message
