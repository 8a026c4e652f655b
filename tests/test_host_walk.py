"""The generative test of issue 24: seeded random walks over the host's own CLI object.

Each walk drives ``cli.HermesCLI`` (clikit) with turns of random size (a few
tokens to ~8K; every other walk to ~20K) and kind (prose, code, long identifiers, CJK, repeated "ok" /
"continue"), /undo, /retry, identical re-sends, whitespace edits of tail
messages, /compress, /new, /resume (history restored from the host's SessionDB),
/branch, a second CLI on the same session (a real second OS process, as two
terminals running ``hermes -c``), process restarts and tool calls. After every step (walkkit.Walk.step): per session the stored
user/assistant rows equal the oracle's (0 duplicates, 0 lost, 0 misfiled,
0 phantom); after each chat the last request ends with the newest user message
and its tool pairs are valid; after a compaction the host's own
estimate_request_tokens_rough of the request is under the threshold, the real
count under the window, and the raw tail is not starved.

Bounded for CI: ``HOSTWALK_WALKS`` walks (default 2) of ``HOSTWALK_STEPS`` steps
(default 40), seeds from ``HOSTWALK_SEED`` (default 2400), and the replays of walks
that once failed up to ``HOSTWALK_REPLAY_STEPS`` steps (default 120); the longer
replays (each fault also has a test of its own, named in ``LONG_REPLAYS``) run with
``HOSTWALK_REPLAY_STEPS=0`` (no bound), as before a release. A failure names the
seed and step; replay it with ``python bench/soak.py --seed S --steps N``.
Thousands of steps: bench/soak.py. The replays of walks with rare flows weighted up
(``WEIGHTED_REPLAYS``) run in tests/test_host_walk_weighted.py, the walks with the host's
background review forks on in tests/test_host_walk_reviews.py (files of their own, so the
suite's two workers share the walks).

The same walks with trove on PostgreSQL (``TROVE_DATABASE_URL``, a fresh schema per
walk on the server ``PG_TROVE_TEST_URL`` names, tests/pgkit.py; the oracle reads the
rows there): a fresh walk and the ones that once failed there only (``PG_REPLAYS``), skipped without
a server (failing with ``PG_TROVE_REQUIRE=1``). Soak: ``bench/soak.py --postgres``.
"""
import os

import pytest

import clikit as ck
import hostkit as hk
import pgkit
import walkkit as wk

pytestmark = pytest.mark.host

WALKS = int(os.environ.get("HOSTWALK_WALKS", "2"))
STEPS = int(os.environ.get("HOSTWALK_STEPS", "40"))
SEED = int(os.environ.get("HOSTWALK_SEED", "2400"))


@pytest.fixture(scope="module")
def server():
    with hk.FakeOpenAIServer(prompt_tokens_fn=ck.real_prompt_tokens) as fake:
        yield fake


def largest_turn(walk: int) -> int:
    """Every other walk has turns up to 20K tokens (some larger than the threshold
    once the host counts their api_content sidecar: seed 90004 found a fault only
    there); the others up to 8K."""
    return 20_000 if walk % 2 else 8_000


def run_walk(tmp_path, server, seed: int, steps: int, *, postgres: bool = False,
             reviews=False, **options):
    """One walk in a fresh home (and with ``postgres`` a fresh schema; with ``reviews``
    the host's background review forks on, clikit.CliHost's): returns the Walk after its run
    (``options``: Walk's use_process, largest_turn)."""
    with pgkit.store_env(postgres) as store, \
            ck.CliHost(tmp_path, server=server, responder=wk.ScriptedModel(seed), extra_env=store,
                       reviews=reviews) as host:
        w = wk.Walk(host, seed, steps=steps, **options)
        w.run()
        assert not host.env.blocked
    return w


@pytest.mark.parametrize("walk", range(WALKS))
def test_random_walk_over_the_cli_keeps_every_message_once(tmp_path, server, walk):
    seed = SEED + walk
    w = run_walk(tmp_path, server, seed, STEPS, use_process=True, largest_turn=largest_turn(walk))
    stats = w.stats
    assert stats.steps, "the walk took no step"
    assert stats.clean, (wk.describe(stats) + f"\nsteps: {w.log}\n"
                         f"replay: python bench/soak.py --seed {seed} --steps {STEPS} --walk-steps {STEPS}"
                         f" --largest-turn {largest_turn(walk)}")


# Walks that once failed (seed: steps), replayed as the soak ran them: seed 5 stored
# the tail after a doubled block again on a /resume after /compress and /branch
# (step 26), and a second CLI's restore that starts with a retried message's older
# attempts again (step 47). Seed 2 starved the tail beside a big newest turn (step
# 14) and stored a retried exchange twice that both copies of a doubled block
# showed (step 54); seed 12 stored a transcript the host had written to its
# state.db twice after two /undo (step 52); seed 16 returned the rows of a doubled
# restore twice from a /compress, and the next turn stored the second copies (step
# 36) and, at exit, the previous session's doubled transcript in the resumed one;
# seed 18 stored the parent's transcript, handed over at exit under its
# branch's id after /new and /resume, in the branch (exit after step 59); seed 9
# took the host's overhead from an estimate of a list without the re-sent message
# and left the prompt over the trigger after a compaction (step 15). Seed 7302: a
# second CLI restored a transcript holding a /retry's older reply, which no summary
# covered (the first CLI never showed it again); its compaction kept that reply raw
# beside the fresh tail, two assistant turns in a row, and the host merged them into
# a message nobody sent, stored as new (step 25). Seed 8400: a /branch of a /branch
# that never stored anything shows its grandparent's block, which was read as the
# user's message (step 56); seed 9504: a second process resumed a fresh /branch (it
# never saw the /branch) and stored the parent's block as a user message (step 19).
# Seeds 9505, 30004, 30009 starved the tail: the provider's real count taken as a
# host estimate after a tool call (step 23); a second CLI's previous exchange that
# the first had summarized left out (step 50); the current turn's api_content
# sidecar counted twice where the host counted it once (step 37). Seed 70003: a
# /compress right after a big turn kept it, and the next request was over the
# threshold by the host's own-list estimate, which its preflight never ran on the
# short list (step 9). Seed 80000: after /new, a compaction there and /resume,
# the exit handed the other session's compacted list under the resumed id, and its
# block and replies were stored there (step 46); seed 80001: a /retry after a
# /branch and a /compress between turns matched the re-sent text to the old row
# (step 60); seed 90004 (turns up to 20K tokens): a /resume restored a compacted
# list twice, both copies ending in "ok" like the turn after them, and the first
# copy's "ok" was read as that newer one, the second's stored again (step 28).
# With the second CLI in this process (`bench/soak.py --in-process`), two engine
# copies on one session: seed 100002's other CLI went unstored once the first CLI
# left the session (the hooks found no engine for it: step 22); seed 100018's turn
# was named to one copy and compacted through the other, and both stored it (step 8).
# Seed 110001: /compress twice, /branch, exit: the branch stored the parent's list from
# before the last /compress, handed over under its id, as its own copy (step 19).
# Seed 120017 (turns up to 20K tokens): a big turn's compaction only re-rendered the
# block; the host's preflight loop did not count it as progress and kept the old list
# as the turn's history, so state.db held the compacted list twice and a /resume
# restored a message nobody sent (the turn's text and the block merged: step 19).
# Seed 120000 (turns up to 20K tokens, in this process): a /compress that could not
# cut a big turn left the within-turn no-op guard, and the next turn's preflight,
# counted lower, skipped its compaction and went out over the threshold (step 39).
# Seed 150004 (turns up to 20K tokens): a second CLI's list restored before three
# /retry attempts were summarized ("ok", T9, "ok", T9, reply, T9, ...): the view's "ok"
# was read as the second one and the first "ok" and T9 stored again (step 40).
# Seed 140012: a re-send after a /retry compacted in its turn; the list after it ended
# with a new "ok", and the whole-history reading lined the list up with the /retry's
# dropped first attempt ("ok", T4: rows older than the block's newest, left out of it),
# which matched one more element than the views, so the reply was read as stored (step 14).
# Seed 160013 (turns up to 20K tokens, in this process): /branch, /undo, /compress: the
# branch's first list was the compress's, without the undone exchange; the engine stored
# that copy, right, but the walk's oracle expected the copy from before the /undo (step 45).
# Seed 120004 (turns up to 20K tokens, in this process): two Chinese turns of ~20K real
# tokens stayed under the host's chars/4 figure of the threshold and the request went
# over the window, the host never asking (the trigger now reads real tokens too); with
# that trigger, seeds 160002 and 160006 (the same sizes, in this process): an /undo and
# the same text re-sent, compacted in its turn, and the reply read as the undone turn's
# and lost (steps 19 and 39). Seed 160017 (the same variant): the second CLI's list showed
# its old block and a /retry's first attempt ("[T8]", "ok") between rows its view held;
# the first CLI had summarized those rows since, so they were no candidates and were
# stored again, and an older list whose "ok" replies matched the new ones outvoted the
# view the list went on from (step 36). Seed 170009 (the same variant): the same with the
# attempt after the last row the view held (step 19). Seed 170003 (the same variant):
# the other CLI's turn ended through the first CLI's engine copy (the hooks reach the
# copy bound last), which paired its own last provider count with the other's list: a
# real overhead of 27K, and the next compaction left every summary out (step 43).
# Seed 180004: a turn sent four times (/retry, re-sends), a /resume and a whitespace
# edit; the view read against it held two of the four, its (T3, "ok") was read as the
# third copy and the gap before it had rows for only part of it: the second copy stored
# again (step 17).
# Seed 250002: a second CLI's list restored before the first CLI's /retry of a turn
# showed the turn and its first reply; the first CLI's views (without that attempt)
# read the turn as the retried copy, and the reply, lining up with nothing after it,
# was stored again (step 51).
# Seed 280003: a second CLI's transcript kept a /retry's dropped attempt right after the
# block (ok, T32, ok, T32, ...) that the view after the block lists without it (ok, T32,
# ...); the view's "ok" was read as the later one and the attempt stored again (step 92).
# Seed 280002: a second CLI restored the session long before its first list, which shows
# an old block (its compaction's turn undone since) and turns the first CLI summarized
# since; only the returned view still held that block, it matched none of the turns, and
# all 16 were stored again (step 255).
# Seed 490000 (turns up to 20K tokens): a /branch, a /retry on the branch before its first
# turn (its copy, the retry's list, without the copied exchange that state.db keeps
# active), an /undo, then /resume of the branch and /new: the restored copied send was
# read as the re-send and only its reply stored, after the re-send's (step 132).
# Seed 220005: a big newest turn took the tail's share; the 150-token turn before it
# was held against the block as it stood, summarized, and the pass condensed that block
# into less: the tail starved by the room the old block had taken (step 25).
# Seed 500000: the same as 490000 with a text the session held twice ("continue"): a
# second CLI restored the branch before the /retry and showed the copied attempt and
# its reply; the send was read as the re-send's row, only its reply stored (step 130).
# Seed 520001 (turns up to 20K tokens): a compaction, a /retry of the turn after it (T23),
# a second CLI restoring that list ([block, T23, ok, T23, reply 46]), then the first CLI's
# /undo and re-send; the first CLI's view read T23, ok as the re-send's rows, reply 46
# lined up with nothing after them and the retry's T23 and reply were stored again: the
# slide back stopped at the block (step 74).
# Seed 610002 (turns up to 20K tokens, in this process): a /resume restored a compacted list
# twice (block, rows, block, the same rows) after later compactions had summarized its older
# rows; a /compress kept those, shown again after the second block, raw after the first
# copy's newer live rows ([block, reply T65, reply T52, T53, ...]), and the /retry's list had
# the two replies merged by the host: a message nobody sent, stored (step 222).
# Seed 610001 (turns up to 20K tokens, the second CLI in this process): a /resume restored
# a compacted session's transcript twice, block included, with the original timestamps;
# the re-send of its last question (T30), shown first to the turn's compaction pass, was
# read by rule 5 as the replay of the earlier copy's T30 (the later copy's elements, rule 7's,
# read as nothing, held no place): it shared that row, left the prompt and was lost (step 221).
# Seed 630003: a /branch, a /retry on it before its first turn, an /undo and the text sent
# again; a second CLI restored the branch with the copied send and its reply before the
# re-send (state.db keeps them active): between two matched rows the send lined up with
# the undone retry's, which a view lists answered by another reply, and only the reply was
# stored (step 28); once both were stored after the first CLI's newer rows, a /resume read
# against the first CLI's view had them in a gap whose rows by store order were the retry's,
# and they were stored again (step 54).
# Seed 640000 (the second CLI in this process): a /retry on a /branch before its first
# turn; state.db keeps the first attempt ("continue", "ok") after the retried exchange, and
# the second CLI's restored list stored it after every row around its place. That view
# left the rings; a /resume's list, read against a view without the attempt, gave the
# retried exchange's rows to the attempt (the latest of equal elements), and the retried
# exchange, between two consecutive rows, was stored again (step 122). The attempt's
# timestamps name its rows.
# Seed 680002 (turns up to 20K tokens): a turn sent four times (/retry, re-sends), a /resume
# restoring every attempt, a whitespace edit and an /undo of the last send with the text
# sent again; the newest view (the last two sends) was read as the first two, and the
# first reply and the third send with its reply, after the session's last row, were
# stored again: the slide back needed rows after the last match (step 193).
REPLAYS = {2: 56, 5: 48, 9: 20, 12: 54, 16: 60, 18: 60, 7302: 25, 8400: 56, 9504: 19, 9505: 24,
           30004: 51, 30009: 38, 70003: 10, 80000: 46, 80001: 60, 90004: 28, 100002: 22,
           100018: 8, 110001: 19, 120000: 39, 120017: 19, 140012: 14, 150004: 40, 160013: 45,
           120004: 60, 160002: 19, 160006: 39, 160017: 36,
           170003: 44, 170009: 19, 180004: 17, 220005: 26, 250002: 51, 280003: 92,
           280002: 255, 490000: 132, 500000: 130, 520001: 74, 610001: 221, 610002: 222,
           630003: 54, 640000: 122, 680002: 193}
LARGEST_TURN = {90004: 20_000, 120000: 20_000, 120017: 20_000,
                150004: 20_000, 160013: 20_000, 120004: 20_000, 160002: 20_000,
                160006: 20_000, 160017: 20_000, 170003: 20_000, 170009: 20_000,
                250002: 20_000, 280003: 20_000,
                280002: 20_000, 490000: 20_000, 500000: 20_000,
                520001: 20_000, 610001: 20_000, 610002: 20_000,
                680002: 20_000}   # tokens; the walks' default elsewhere
IN_PROCESS = {100002, 100018, 120000, 160013, 120004, 160002, 160006,
              160017, 170003, 170009, 610001, 610002, 640000}    # the second CLI in this process


# The replays over REPLAY_STEPS steps (~1 minute each; the walk file ran alone on one
# test worker for most of the suite) and the tests that hold each fault on their own.
REPLAY_STEPS = int(os.environ.get("HOSTWALK_REPLAY_STEPS", "120"))
LONG_REPLAYS = {
    280002: "test_identity_blocks.py::test_a_second_copys_old_list_after_a_returned_block_keeps_rows_summarized_since",
    490000: "test_host_identity.py::test_a_branch_retried_then_undone_keeps_the_copied_attempt",
    500000: "test_identity_branches.py::test_a_branchs_copied_attempt_restored_after_its_retry_is_a_send_of_its_own",
    610001: "test_identity.py::test_a_text_re_sent_after_a_doubled_compacted_transcript_is_a_new_message",
    610002: "test_rewrites.py::test_a_doubled_restore_keeps_no_summarized_row_after_a_newer_one",
    640000: "test_identity_branches.py::test_a_restored_attempt_stored_after_the_rows_around_it_keeps_its_row",
    680002: "test_identity_branches.py::test_a_restored_retry_chain_whose_last_send_is_undone_keeps_its_rows",
}


@pytest.mark.parametrize("seed", sorted(REPLAYS))
def test_walks_that_once_failed_stay_clean(tmp_path, server, seed):
    if REPLAY_STEPS and REPLAYS[seed] > REPLAY_STEPS:
        pytest.skip(f"a {REPLAYS[seed]}-step replay (HOSTWALK_REPLAY_STEPS=0 runs it); "
                    f"its fault's own test: {LONG_REPLAYS[seed]}")
    w = run_walk(tmp_path, server, seed, REPLAYS[seed], use_process=seed not in IN_PROCESS,
                 **({"largest_turn": LARGEST_TURN[seed]} if seed in LARGEST_TURN else {}))
    assert w.stats.steps == REPLAYS[seed]
    assert w.stats.clean, wk.describe(w.stats) + f"\nsteps: {w.log}"


# On PostgreSQL (seed: steps; the walks' defaults otherwise): a fresh walk of
# HOSTWALK_PG_STEPS steps from HOSTWALK_SEED, then the walks that failed only there.
# Seed 310003: a second process's turn needed the identity read's count of the rows
# between two of a view's rows; PostgreSQL 15 refused its unnamed subquery, and from
# then on no turn of that session was stored (step 20).
PG_STEPS = int(os.environ.get("HOSTWALK_PG_STEPS", "20"))
PG_REPLAYS = {SEED: PG_STEPS, 310003: 20}


@pytest.mark.parametrize("seed", sorted(PG_REPLAYS))
def test_walks_on_postgresql_keep_every_message_once(tmp_path, server, seed):
    pgkit.require_pg()
    w = run_walk(tmp_path, server, seed, PG_REPLAYS[seed], postgres=True)
    assert w.stats.steps == PG_REPLAYS[seed]
    assert w.stats.clean, (wk.describe(w.stats) + f"\nsteps: {w.log}\nreplay: python bench/soak.py"
                           f" --postgres --seed {seed} --steps {PG_REPLAYS[seed]}"
                           f" --walk-steps {PG_REPLAYS[seed]}")


# Walks with the rare flows weighted up (bench/soak.py --weight ..., in-process), replayed:
# seed -> (weights, steps). With a gateway on the same database (``--weight chat=8
# --weight gateway=15 --weight new=10 --weight resume=8 --weight restart=10``): seed 900000
# stored the CLI's previous transcript, handed over at exit after /new, under the new
# session once the gateway's views were the newest (rule 4 read only those:
# ``identity.earlier_sessions``); 900007 is a /branch of a doubled restore that the
# oracle had no one-copy reading of. With /undo, /branch and /compress weighted up
# (``--weight chat=15 --weight branch=10 --weight undo=8 --weight retry=8 --weight
# whitespace=10 --weight compress=8``): seed 960003 stored an exchange undone in the
# parent, handed over at exit under its branch's id, in the branch (the fast paths read
# a handed-over list as going on with new messages). With tool calls weighted up too
# (``--weight tool=8``, turns up to 20K tokens): seed 1110000 sent a turn four times in a
# session (answered "ok", /retry, /undo and the text again, /retry), /branch twice, then
# /resume restored the attempts state.db keeps active and an /undo with the text sent
# again: the re-send's view, which the restored list goes on from, gave its rows to the
# first send, the re-send lined up with the last retry's row (answered otherwise in a
# view) and was stored again with its "ok" (step 71). Seed 1110002 (the same weights,
# turns up to 20K tokens): state.db held a compacted list twice, the second time with new
# timestamps on the block and the turn the compaction ran in; a /resume restored both and a
# /branch copied them. No view explained the branch's first list, rule 7 shared only the
# rows of the elements with equal timestamps and rule 5 was not applied after the legacy
# alignment: that turn was stored twice (step 144; a 144-step replay, ~1 minute; its own
# test: test_identity_branches.py::test_a_branchs_first_list_of_a_doubled_compacted_restore_stores_its_tail_once).
# With /compress, /undo and re-send and /resume weighted up (``--weight chat=12 --weight
# compress=10 --weight undo_resend=8 --weight resume=8 --weight new=6 --weight branch=6
# --weight gateway=6``): seed 1130002's /compress after an /undo and re-send returned the
# list, which the host wrote to its state.db twice, stamping the re-sent turn anew at each
# write (the first turn kept its timestamps); a /resume restored both copies and the
# re-sent turn's second copy was stored as a third send (step 45; the same without the
# gateway's writes). With a second CLI weighted up (``--weight open_other=10 --weight
# chat_other=15 --weight close_other=4 --weight compress=10 --weight chat=10 --weight undo=6
# --weight retry=6 --weight restart=6``, turns up to 20K tokens): seed 1240009's two CLIs on
# one session each compacted it into a block of their own (the first by /compress, after
# re-sending its last turn); the host's state.db appended the first CLI's returned list
# (its block, the re-sent turn and both replies) inside the second CLI's transcript, and a
# new second CLI restored it. Read against the second CLI's view, that block and its rows
# lay between two consecutive rows, no row stood between them, and the turn and its two
# replies were stored again (step 27; the rows a view lists after a block the gap shows
# are its candidates now). With the provider's real window changing mid-walk
# (``--weight stepdown=12 --weight chat=20 --weight compress=6 --weight undo=5 --weight
# retry=5 --weight branch=4 --weight new=3 --weight resend=4``): seed 1290001 restarted the
# CLI, then the provider held 24,576 tokens and refused the next request; the host stepped
# its window down and called compress with its estimate of the messages alone (no tool
# schemas), the restarted engine knew no real overhead yet, read the request as under the
# trigger and did nothing, and the host gave up on the turn (step 59; the learned overhead
# is kept in the session's state now). With /undo, /branch and tool calls weighted up and
# restarts and /resume too (``--weight restart=6 --weight resume=6``, turns up to 20K
# tokens): seed 1310001's /resume restored a compacted list state.db held twice (the
# second write stamping every message anew), a /retry re-sent its last question, a
# /branch copied the list and the question was sent a third time. No view explained the
# branch's first list, and rule 5 paired the retry's send (no timestamp: sent since the
# restore) after the later block with the restored question after the earlier one: the
# two shared one row and the send was lost (step 77; a replay ends at the first message
# without a timestamp now). With the same weights, seed 1500005 sent a turn twice in a
# session (each answered "ok" through a tool call), /branch, a /retry on the branch before
# its first turn (the branch's first list dropped the copied second send, which state.db
# keeps active), then a restart restored the copied send between the first send's "ok" and
# the retry. The view's "ok" was read as the copied send's, the first "ok" and the copied
# send lay between two consecutive rows, the view's run could not slide back (no rows for
# what it left) and rule 1 made the later "ok" new: the first "ok" was stored again
# (step 33; a run opening with a reply slides when it leaves no more to store than the gap).
# With the same weights, seed 1540000 restored a list state.db held twice (a turn after
# each copy of a block), /branch twice, and a /retry as the last branch's first turn
# compacted, summarizing the copied turn. The engine stored that turn once (state.db's
# copy holds it), but the oracle knew only the list at the branch point (with the retried
# exchange) and the list the turn left (without the summarized turn), so it read the
# branch's row as a second copy (step 58; an oracle fault: the list a /retry is sent
# with, ``Oracle.retrying``, is the branch's copy). The same oracle fault with /resume
# left out (``--weight restart=6`` only, 8K turns, on PostgreSQL first): seed 1560000's
# doubled restored turn, /branch, and a compacting /retry as the branch's first turn; the
# branch's second copy of the turn read as lost (step 26). With /resume lighter
# (``--weight restart=6 --weight resume=4``, 8K turns, on PostgreSQL first): seed 1590006
# sent "continue" twice (each answered through a tool call, then "ok"), /branch, a second
# CLI restored the branch, and the first CLI's /undo and re-send of the text were the
# branch's first list. The second CLI's next turn showed the copied send and its reply:
# read against the re-send's view, the send lined up with the re-send's row and its "ok"
# with the re-send's, the call and result between them with no row, and only the reply
# was stored (step 53; the matched send before such a run, answered otherwise in a view,
# is a send of its own now, as inside a run). With a second CLI weighted up and /branch
# and /resume too (``--weight branch=5 --weight resume=4``, turns up to 20K
# tokens, the second CLI a real second process: ``PROCESS_REPLAYS``): seed 1580012's
# /resume restored a compacted list twice, the later copy without the exchange after the
# earlier one (question, reply), and a /compress summarized both as stale but kept the
# question raw, last, as the newest user message of the rows by their first showing.
# The next send followed it and the host merged the two ("A\n\nB"); after an /undo and
# the merge sent again, a second CLI restored state.db's question and merge as one more
# merge, a message nobody sent, and stored the reply after it ("ok") again (step 38; the
# tail keeps the list's own last user message: ``tail_rows.candidates``).
# With a second CLI weighted up and /branch, whitespace and tool turns too (``--weight
# branch=5 --weight whitespace=5 --weight tool=5``, 8K turns): seed 1620002 failed at step
# 19 (after a tool turn, the reply "Noted (reply 9)..." stored twice) before d047ce9, host
# walk 1590006's fix, and passes since. Seed 1620011: a second CLI sent "continue" on a
# session the first CLI had compacted, the first CLI's /compress after a /new and /resume
# restored state.db's list written twice around that turn ([block, ..., T6, ok, continue,
# reply, block, ..., T6, ok]). Read against the first CLI's view, the turn lay between
# the first copy's last row and the replay's lower first row: no row between them, and
# the turn was stored again (step 51; a run whose next matched row is lower goes on
# after its last row: ``identity.find_gaps``). With /undo, /branch, tool calls, restarts
# and /resume weighted up (turns up to 20K tokens): seed 1640002's /retry on a branch
# before its first turn stored the re-send's exchange first; a /resume restored the copied
# send state.db keeps before it, stored then after later rows; a second CLI went from the
# copied send to turns of its own, and a restart's restore [copied, re-send, turns, the
# second CLI's turns] read against the second CLI's view had the re-send between two rows
# with only later rows between them by store order: the re-send and its reply were stored
# again (step 81; a view that never held the gap's later row gives the older rows it lists
# after the earlier one: ``listed_between``). With the same weights, seed 1670001's
# /branch, then /retry on the branch before its first turn (dropping the copied exchange
# state.db keeps), another /retry, an /undo and re-send and one more /retry; a restart
# restored the copied send and three of the sends. Between the first reply's row and the
# last send's, the gap's LCS gave each restored send the row of the one before it, no reply
# lined up, every send read as one of its own, and the first retry's exchange was stored
# again (step 70; the run is lined up again without each send of its own:
# ``Alignment._without_own_sends``).
# With a second CLI weighted up and /branch, whitespace, tool turns and /resume too
# (``--weight branch=5 --weight whitespace=5 --weight tool=5 --weight resume=4``, 8K
# turns): seed 1710006 sent a turn ("ok"), /retry (another reply), and a second CLI
# restored the session (state.db kept both exchanges); the first CLI's /undo and re-send,
# another re-send and a /retry of it followed. The second CLI's next turn, read against
# the newest view, matched the retried text with the last retry's send, answered
# otherwise, read it as a send of its own, and the first retry's exchange was stored
# again (step 50; a view listing the text answered by the run's reply gives those rows:
# ``alignment._exchange_listed``).
# With /undo, /branch, tool calls, restarts and /resume weighted up (``--weight
# resume=5``, 8K turns, on PostgreSQL first): seed 2400000's /branch, an /undo on the
# branch (its last exchange, T9), a second CLI restored the branch (state.db: the copy
# without T9), the first CLI's /undo and re-send of T5 was the branch's first list (the
# copy up to T4's reply); the second CLI's turn showed the copied T5 exchange, stored
# then (step 38). The engine was right, the oracle wrong: its candidate copies were the
# list at the branch point (T9 read as lost) and the first list (T5 as a second copy);
# a second CLI's restore before the first ingest is one now (``Oracle.opened``).
# With /undo, /branch, tool calls and restarts weighted up and /resume at 5 (8K turns,
# found first on PostgreSQL): seed 2380001's /branch of a compacted session, a tool turn
# answered "ok" and one more turn on the branch, both undone; state.db held the branch's
# list twice (the block and the turns from T5 on stamped anew) and a /resume restored
# both. The views list the undone "ok" after the kept rows, so the later copy's "ok"
# (T5's reply) took that row; the /compress returned it last, T5's question right before
# "yes", the host merged the two ("A\n\nB") and the next turn stored the merge and the
# rows after it again (step 46; a replay's two copies with two rows take the earlier
# copy's: ``identity._share``).
# With 1710006's weights (in this process, on PostgreSQL first), seed 2410002's branch
# of a branch held a compacted list state.db wrote twice ([block, reply,
# T11, reply, T12 ...] and again, stamped anew); a second CLI restored it, and the first
# CLI undid the second copy's T11 and sent its text again. The second CLI's next turn,
# read against that view, gave the restored T11 the re-send's row (the latest copy)
# while the reply after it replayed the first copy's; its compaction kept that row by
# its first showing, last before the turn's message, and the host merged the two: a
# message nobody sent, stored (step 52; fixed by 2380001's rule: a replay's two copies
# with two rows take the earlier copy's, ``identity._share``).
# With 1710006's weights, seed 1910002 (only with the
# second CLI a real process: in-process, a restart closes it and the walk goes
# elsewhere): on a /branch, "go on" answered a16, a /retry (ok), a re-send (ok), a
# /compress (state.db rewritten without a16's attempt), a /retry (a19, dropping the
# re-send's exchange, which state.db keeps), two re-sends and a restart restoring
# [..., T6, ok, go on, ok, go on, ok, go on, a19, ...].
# The newest view lists one (go on, ok) there: read as the later copy, slid once to the
# middle one, it left the first copy between T6's "ok" and the view's run, where the
# rows between were the dropped attempt (go on, a16): two rows by count, so no further
# slide, and that copy was stored again as a send of its own (step 38; rows between
# that do not line up with the gap count as none, and a slide's gap may take the next:
# ``Alignment._slide_into_room``). Seed 1910005 (the same, a real process; it failed in
# three runs of four before the fix): two CLIs on a compacted session, the first
# restarted after the second's T16, "continue" and T17 showed "continue" and T17 without
# T16; read against its view [..., T12, ok, T16, ok], the "ok" after "continue" matched
# T16's, bounded the gap before it and "continue" and its "ok" were stored again (step
# 56; replies read last after an unmatched element anchor no gap:
# ``identity._unanchor_trailing_replies``).
# With a second CLI weighted up and /branch, whitespace, tool turns, /resume and
# /undo-and-re-send too (``--weight branch=6 --weight whitespace=6 --weight tool=6
# --weight resume=5 --weight undo_resend=6``, 8K turns, no compaction): seed 3330003's
# /branch, the first CLI's /undo and re-send of the copied T2 (reply 10) the branch's
# first list; a second CLI, restored before, sent "go on" after its copy of T2 (reply 6)
# and stored that copy. A /resume restored state.db's [..., T2, reply 10, go on, ...];
# read against the second CLI's view T2 matched its copy, reply 10 lined up with no row
# before "go on", T2 read as a send of its own and the re-send's exchange was stored
# again (step 42; between two matches too, a view listing the text answered by the
# run gives those rows: ``alignment_rows.listed_or_own_send``).
# With /undo, /branch, tool calls, restarts and /resume weighted up and /new too
# (``--weight new=4``, 8K turns, in this process): seed 3320002's second CLI compacted
# inside a turn and kept the reply before it raw ([block, reply, T9]); the session
# resumed, a turn and its /undo, /branch, an /undo on the branch down to [block, reply]
# and /new, which handed that list over under the branch's id before any turn of its
# own. The parent's view explained it, but by one message only (the block was not
# counted), so it was not the parent's and the reply was stored again in the branch
# (step 78; another session's block and a message it holds are two elements:
# ``identity.foreign_owner``). Then, on the branch: /undo of the copied T20, a /retry
# of T19 as its first list (state.db keeps the copied last (T19, ok)), a tool turn and
# its /undo, another /retry of T19, a restart. The next turn's list shows the copied
# (T19, ok) before both retries; the newest view's LCS took the newest copies of the
# repeated T19/ok, split "question 9" from its "ok" and lost to the undone turn's view,
# whose "ok" the copied one took: the first retry's exchange was stored again, the
# copied "ok" lost (step 108; among equally long pairings the one that keeps more
# pairs next to each other wins: ``sequences._lcs_table``).
# Entries: (weights, steps) or (weights, steps, largest turn).
GATEWAY_WEIGHTS = dict(wk.STEP_WEIGHTS, chat=8, gateway=15, new=10, resume=8, restart=10)
UNDO_BRANCH_WEIGHTS = dict(wk.STEP_WEIGHTS, chat=15, branch=10, undo=8, retry=8, whitespace=10,
                           compress=8)
UNDO_BRANCH_TOOL_WEIGHTS = dict(UNDO_BRANCH_WEIGHTS, tool=8)
UNDO_BRANCH_TOOL_RESTART_WEIGHTS = dict(UNDO_BRANCH_TOOL_WEIGHTS, restart=6)
UNDO_BRANCH_TOOL_RESUME_WEIGHTS = dict(UNDO_BRANCH_TOOL_RESTART_WEIGHTS, resume=6)
UNDO_BRANCH_TOOL_LIGHT_RESUME_WEIGHTS = dict(UNDO_BRANCH_TOOL_RESTART_WEIGHTS, resume=4)
UNDO_BRANCH_TOOL_MID_RESUME_WEIGHTS = dict(UNDO_BRANCH_TOOL_RESTART_WEIGHTS, resume=5)
UNDO_BRANCH_TOOL_RESUME_NEW_WEIGHTS = dict(UNDO_BRANCH_TOOL_RESUME_WEIGHTS, new=4)
COMPRESS_RESUME_WEIGHTS = dict(wk.STEP_WEIGHTS, chat=12, compress=10, undo_resend=8, resume=8,
                               new=6, branch=6, gateway=6)
OTHER_PROCESS_WEIGHTS = dict(wk.STEP_WEIGHTS, open_other=10, chat_other=15, close_other=4,
                             compress=10, chat=10, undo=6, retry=6, restart=6)
OTHER_PROCESS_BRANCH_WEIGHTS = dict(OTHER_PROCESS_WEIGHTS, branch=5, resume=4)
OTHER_PROCESS_BRANCH_TOOL_WEIGHTS = dict(OTHER_PROCESS_WEIGHTS, branch=5, whitespace=5, tool=5)
OTHER_PROCESS_BRANCH_TOOL_RESUME_WEIGHTS = dict(OTHER_PROCESS_BRANCH_TOOL_WEIGHTS, resume=4)
OTHER_PROCESS_UNDO_RESEND_WEIGHTS = dict(OTHER_PROCESS_WEIGHTS, branch=6, whitespace=6,
                                         tool=6, resume=5, undo_resend=6)
STEPDOWN_WEIGHTS = dict(wk.STEP_WEIGHTS, stepdown=12, chat=20, compress=6, undo=5, retry=5,
                        branch=4, new=3, resend=4)
WEIGHTED_REPLAYS = {900000: (GATEWAY_WEIGHTS, 30), 900007: (GATEWAY_WEIGHTS, 30),
                    960003: (UNDO_BRANCH_WEIGHTS, 60),
                    1110000: (UNDO_BRANCH_TOOL_WEIGHTS, 71, 20_000),
                    1110002: (UNDO_BRANCH_TOOL_WEIGHTS, 144, 20_000),
                    1130002: (COMPRESS_RESUME_WEIGHTS, 45),
                    1240009: (OTHER_PROCESS_WEIGHTS, 27, 20_000),
                    1290001: (STEPDOWN_WEIGHTS, 60),
                    1310001: (UNDO_BRANCH_TOOL_RESUME_WEIGHTS, 77, 20_000),
                    1500005: (UNDO_BRANCH_TOOL_RESUME_WEIGHTS, 33, 20_000),
                    1540000: (UNDO_BRANCH_TOOL_RESUME_WEIGHTS, 58, 20_000),
                    1560000: (UNDO_BRANCH_TOOL_RESTART_WEIGHTS, 26),
                    1580012: (OTHER_PROCESS_BRANCH_WEIGHTS, 38, 20_000),
                    1590006: (UNDO_BRANCH_TOOL_LIGHT_RESUME_WEIGHTS, 53),
                    1620002: (OTHER_PROCESS_BRANCH_TOOL_WEIGHTS, 19),
                    1620011: (OTHER_PROCESS_BRANCH_TOOL_WEIGHTS, 51),
                    1640002: (UNDO_BRANCH_TOOL_RESUME_WEIGHTS, 81, 20_000),
                    1670001: (UNDO_BRANCH_TOOL_RESUME_WEIGHTS, 70, 20_000),
                    1710006: (OTHER_PROCESS_BRANCH_TOOL_RESUME_WEIGHTS, 50),
                    2400000: (UNDO_BRANCH_TOOL_MID_RESUME_WEIGHTS, 38),
                    2380001: (UNDO_BRANCH_TOOL_MID_RESUME_WEIGHTS, 46),
                    2410002: (OTHER_PROCESS_BRANCH_TOOL_RESUME_WEIGHTS, 52),
                    1910002: (OTHER_PROCESS_BRANCH_TOOL_RESUME_WEIGHTS, 38),
                    1910005: (OTHER_PROCESS_BRANCH_TOOL_RESUME_WEIGHTS, 56),
                    3330003: (OTHER_PROCESS_UNDO_RESEND_WEIGHTS, 42),
                    3320002: (UNDO_BRANCH_TOOL_RESUME_NEW_WEIGHTS, 108)}
# The ones whose second CLI must be a real second OS process (the others run it in this one).
PROCESS_REPLAYS = {1580012, 1910002, 1910005}
# Their own tests, for the replays over REPLAY_STEPS steps (skipped by default, as above).
LONG_WEIGHTED = {1110002: "test_identity_branches.py::"
                          "test_a_branchs_first_list_of_a_doubled_compacted_restore_stores_its_tail_once"}
