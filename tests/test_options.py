"""common.options.build_options: an unknown option is refused naming the valid ones and the
nearest one."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from common.options import build_options


@dataclass
class Options:
    backfill_share: float = 0.0
    target_usage: float = 0.92


def test_a_misspelt_option_names_the_nearest_one():
    with pytest.raises(ValueError) as e:
        build_options(Options, {"backfil_share": 0.1}, "policy 'p'")
    assert str(e.value) == ("policy 'p': unknown option(s) 'backfil_share' (did you mean 'backfill_share'?); "
                            "valid options: backfill_share, target_usage")


def test_several_unknown_options_each_get_their_guess_and_a_name_like_none_gets_none():
    with pytest.raises(ValueError) as e:
        build_options(Options, {"target_usag": 1, "zzz": 2, "backfil_share": 0.1}, "p")
    msg = str(e.value)
    assert "(did you mean 'backfill_share' for 'backfil_share'?)" in msg
    assert "(did you mean 'target_usage' for 'target_usag'?)" in msg and "for 'zzz'" not in msg
    with pytest.raises(ValueError) as e:
        build_options(Options, {"zzz": 2}, "p")
    assert "did you mean" not in str(e.value)
