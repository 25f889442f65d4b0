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
    assert_poll_ends_with_a_second_look(ptx)


def assert_poll_ends_with_a_second_look(ptx: str) -> None:
    """exchange.row_words: after the poll loop's back edge, one more volatile 64-bit load (the lanes still at 0 look
    again). Without it, a layout that holds a lane in two warps lets the loop end on one copy's count while the
    other copy keeps a 0 (triton 3.9 on the H200 lays out a small tensor so: wrong rows at few long rows without it)."""
    lines = ptx.splitlines()
    polls = [i for i, line in enumerate(lines) if re.search(r"ld\.volatile\.global\.b64", line)]
    labels = {line.split(":")[0]: i for i, line in enumerate(lines) if re.match(r"\$L__BB\d+_\d+:", line)}
    back_edges = [i for i, line in enumerate(lines)
                  if (m := re.search(r"\bbra(?:\.uni)?\s+(\$L__BB\d+_\d+);", line))
                  and labels.get(m.group(1), i) < i and any(labels[m.group(1)] < p < i for p in polls)]
    assert back_edges, "a poll loop"
    assert any(p > back_edges[-1] for p in polls), "a second look after the poll loop"


def assert_departure_without_wait(ptx: str) -> None:
    """PER_WORD's departure (exchange.depart): a count a lane whose result no thread waits for before the
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
