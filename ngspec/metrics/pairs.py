"""(input, response) pairs from datasets of conversations, for the self-repetition metric.

Detected formats: Magpie (``instruction`` + ``response``/``responses``, multi-turn
``instruction_i``/``response_i``), Alpaca (``instruction`` + ``input`` + ``output``, ``history``),
TRL's ``prompt`` + ``completion``, ShareGPT ``conversations``, OpenAI ``messages``, and Spec-Bench /
FastChat answer files (``question_id`` + ``choices[0].turns``; the questions come from
``questions``, joined by id), and ``ngspec generate --json`` output (`generated_pairs`: the
prompts come from the prompt file it ran on, joined by id and turn). For multi-turn records every
assistant turn is a pair whose input is the whole conversation before it.
``input_field``/``response_field`` override detection.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ngspec.datastore.corpus import ASSISTANT_ROLES, MAGPIE_ASKED, TURNS_OF, listed, turn_role, turn_text, turns_layout
from ngspec.errors import NgspecError, json_kind

_TURN = re.compile(r"^(instruction|response)_(\d+)$")


@dataclass(frozen=True)
class Pair:
    id: str
    input: str
    response: str


def _chat_pairs(rid: str, turns: list) -> list[Pair]:
    history, out = [], []
    for turn in turns:
        if (text := turn_text(turn)) is None:
            continue
        if turn_role(turn) in ASSISTANT_ROLES:
            out.append(Pair(f"{rid}.{len(out)}", "\n".join(history), text))
        history.append(text)
    return out


def _answer_turns(record: dict, rid: str) -> list[str]:
    """An answer file's turns (Spec-Bench / FastChat: ``choices[0].turns``, a list of strings)."""
    try:
        turns = record["choices"][0]["turns"]
    except (KeyError, IndexError, TypeError):
        turns = None
    if not isinstance(turns, list) or not all(isinstance(t, str) for t in turns):
        raise NgspecError(f"record {rid}: an answer record needs 'choices': [{{'turns': [strings]}}]")
    return turns


def record_pairs(record: dict, rid: str, questions: dict[str, list[str]], input_field: str | None, response_field: str | None) -> list[Pair]:
    if input_field or response_field:
        inp, resp = record.get(input_field or "", ""), record.get(response_field or "response")
        if not isinstance(resp, str) or not isinstance(inp, str):
            raise NgspecError(f"record {rid}: --input-field/--response-field must name string fields")
        return [Pair(rid, inp, resp)]
    if "choices" in record and "question_id" in record:
        answers = _answer_turns(record, rid)
        asked = questions.get(str(record["question_id"]), [])
        history, out = [], []
        for i, answer in enumerate(answers):
            history.append(asked[i] if i < len(asked) else "")
            out.append(Pair(f"{rid}.{i}", "\n".join(history), answer))
            history.append(answer)
        return out
    for key in ("conversations", "conversation", "messages"):  # `conversation`: LMSYS-Chat-1M's, WildChat's
        if key in record:
            try:
                return _chat_pairs(rid, listed(record, key))
            except NgspecError as exc:
                raise NgspecError(f"record {rid}: {exc}") from None
    if (layout := turns_layout(record)) is not None:  # Alpaca, prompt-completion
        try:
            return _chat_pairs(rid, TURNS_OF[layout](record))
        except NgspecError as exc:
            raise NgspecError(f"record {rid}: {exc}") from None
    turns = sorted((int(m.group(2)), m.group(1), k) for k in record if (m := _TURN.match(k)))
    if turns:
        chat = [{"role": "assistant" if kind == "response" else "user", "content": record[k]} for _, kind, k in turns]
        return _chat_pairs(rid, chat)
    if "instruction" in record:
        responses = record.get("responses") if isinstance(record.get("responses"), list) else [record.get("response")]
        if not isinstance(record["instruction"], str):
            raise NgspecError(f"record {rid}: 'instruction' must be a string, not {json_kind(record['instruction'])}")
        asked = "\n".join(text for key in MAGPIE_ASKED if isinstance(text := record.get(key), str) and text.strip())
        return [Pair(f"{rid}.{i}", asked, r) for i, r in enumerate(responses) if isinstance(r, str)]
    raise NgspecError(f"record {rid}: cannot find (input, response) fields in {sorted(record)}; use --input-field/--response-field")


def is_generated(record: dict) -> bool:
    """A record ``ngspec generate --json`` wrote: an answer (or a failed prompt's error) with its
    prompt's id, turn and drafter, but not the prompt; or the ``{"batch": {...}}`` summary that
    ``generate --json -b B`` ends with (it holds no answer: `generated_pairs` passes it by)."""
    if record.keys() == {"batch"}:
        return isinstance(record["batch"], dict)
    return {"id", "turn", "drafter"} <= record.keys() and ("token_ids" in record or "error" in record)


@dataclass(frozen=True)
class Achieved:
    """What a drafter reached on the answers measured: tokens per verification call."""

    drafter: str
    new_tokens: int
    verify_calls: int

    @property
    def tokens_per_call(self) -> float:
        return self.new_tokens / self.verify_calls if self.verify_calls else 0.0


def generated_pairs(records: list[dict], questions: dict[str, list[str]], source: str) -> tuple[list[Pair], dict[str, list[dict]]]:
    """One pair per (prompt id, turn) answered in ``generate --json`` ``records`` (the first
    answer, where several drafters answered the same prompt: greedy answers are the same), its
    input the prompt's user turns and the answers before it; and each pair's records, for what the
    drafters achieved on it (`achieved`). Failed prompts (an ``error``) are left out."""
    answers: dict[tuple[str, int], str] = {}
    runs: dict[tuple[str, int], list[dict]] = {}
    for record in records:
        if not isinstance(record.get("text"), str):
            continue
        figures = [record.get(name, 0) for name in ("turn", "new_tokens", "verify_calls")]
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in figures) or record["turn"] < 1:
            raise NgspecError(f"record {record['id']}: a `generate --json` record's turn, new_tokens and verify_calls must be counts")
        key = (str(record["id"]), record["turn"])
        answers.setdefault(key, record["text"])
        runs.setdefault(key, []).append(record)
    missing = sorted({rid for rid, _ in answers if rid not in questions})
    if missing:
        given = f"no prompt with id {missing[0]!r} in {source}" if questions else "give the prompt file it ran on with --questions"
        raise NgspecError(f"`ngspec generate --json` records hold the answers but not the prompts: {given}")
    pairs, by_pair = [], {}
    for (rid, turn), answer in answers.items():
        asked, history = questions[rid], []
        for earlier in range(1, turn + 1):
            history.append(asked[earlier - 1] if earlier <= len(asked) else "")
            if earlier < turn:
                history.append(answers.get((rid, earlier), ""))
        pair = Pair(f"{rid}.{turn - 1}", "\n".join(history), answer)
        pairs.append(pair)
        by_pair[pair.id] = runs[(rid, turn)]
    return pairs, by_pair


def achieved(runs: list[list[dict]]) -> list[Achieved]:
    """Tokens per call of each drafter over the records of the pairs measured."""
    totals: dict[str, list[int]] = {}
    for records in runs:
        for record in records:
            total = totals.setdefault(str(record["drafter"]), [0, 0])
            total[0] += record.get("new_tokens", 0)
            total[1] += record.get("verify_calls", 0)
    return [Achieved(drafter, tokens, calls) for drafter, (tokens, calls) in totals.items()]
