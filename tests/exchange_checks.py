"""PTX checks of the row exchange shared by the coop (test_exchange.py) and smem (test_smem.py) tests."""

import re


def assert_fence_free_exchange(ptx: str) -> None:
    """PTX of a single launch: the word published by a relaxed 64-bit exchange and polled by volatile
    64-bit loads, no fence anywhere, and the departure count's operand 1 + (x & y): the dependence on
    the polled words that keeps the count from leaving before the loads returned."""
    assert re.search(r"atom\.global\.gpu\.relaxed\.exch\.b64", ptx), "the word published whole"
    assert re.search(r"ld\.volatile\.global\.b64", ptx), "the words polled past L1"
    assert not re.search(r"\b(fence|membar)\.", ptx), "no fence"
    count = re.findall(r"atom\.global\.gpu\.relaxed\.add\.u32 %r\d+, \[[^]]*\], (%r\d+);", ptx)[-1]
    made = re.search(rf"add\.s32 \s*{re.escape(count)}, (%r\d+), 1;", ptx)
    assert made, "the departure's operand is 1 + a value"
    assert re.search(rf"and\.b32 \s*{re.escape(made.group(1))}, %r\d+, %r\d+;", ptx), \
        "... that depends on the combined value (not folded to a constant)"


def assert_departure_without_wait(ptx: str) -> None:
    """PER_WORD's departure (coop.depart): a count a lane whose result no thread waits for before the
    output stores. No barrier follows the count (Triton broadcasts a scalar atomic's result through
    shared memory behind one), and its result register is first read after a global store."""
    lines = ptx.splitlines()
    at = max(i for i, line in enumerate(lines) if re.search(r"atom\.global\.gpu\.relaxed\.add\.u32", line))
    result = re.search(r"add\.u32 (%r\d+),", lines[at]).group(1)
    rest = lines[at + 1:]
    assert not any(re.search(r"\bbar\.|barrier", line) for line in rest), "no barrier after the count"
    first_use = next(i for i, line in enumerate(rest) if re.search(rf"{re.escape(result)}\b", line))
    first_store = next(i for i, line in enumerate(rest) if "st.global" in line)
    assert first_store < first_use, "the count's result first read after the output stores"


def assert_exchange_of_phase(ptx: str, phase: int, per_word: bool = False) -> None:
    """The single launch (phase 0) exchanges as assert_fence_free_exchange wants (and, per_word,
    departs as assert_departure_without_wait wants); two phases use no global atomics at all."""
    if phase == 0:
        assert_fence_free_exchange(ptx)
        if per_word:
            assert_departure_without_wait(ptx)
    else:
        assert "atom.global" not in ptx, "atomics only in the single launch"
