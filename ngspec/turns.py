"""Multi-turn questions, asked as Spec-Bench asks MT-bench's: every later turn follows the
conversation so far.

A question with turns ``[q1, q2]`` is two prompts: ``q1`` alone, then the chat
``[user q1, assistant a1, user q2]``, where ``a1`` is the answer to ``q1``, decoded without special
tokens and stripped, as FastChat and Spec-Bench put it back into the conversation. In `ngspec bench`
``a1`` is transformers' greedy answer (the reference every arm is checked against): every arm is
lossless, so that is each arm's own answer too, and taking the reference's keeps every arm's prompt
the same when one differs (a near-tie in low precision); sampling (``--temperature``), it is
transformers' sampled answer. In `ngspec generate` it is the answer just generated. The second turn is where search drafting has the most to find: "Rewrite your previous
response..." asks for text that is already in the context.
"""

from __future__ import annotations

from dataclasses import replace

from ngspec.decode import check_prompt
from ngspec.errors import NgspecError
from ngspec.prompts import Prompt, encode, encode_messages, prompt_ids


def split_turns(prompts: list[Prompt], every_turn: bool) -> list[Prompt]:
    """One prompt per turn asked, each question's turns one after another; with ``every_turn``
    False, only the first turns."""
    out = []
    for p in prompts:
        out.append(p)
        if every_turn:
            out += [replace(p, text=text, turn=k) for k, text in enumerate(p.turns[1:], 2)]
    return out


def turn_ids(tokenizer, prompt: Prompt, answers: list[list[int]], raw: bool = False) -> list[int]:
    """Token ids asking ``prompt``: a first turn alone; a later turn after every earlier turn and its
    answer (``answers``, token ids, one per earlier turn). Through the chat template unless
    ``raw`` or the tokenizer has none; then the turns and answers are joined by blank lines."""
    if prompt.turn == 1:
        return prompt_ids(tokenizer, prompt, raw)
    if len(answers) != prompt.turn - 1:
        raise ValueError(f"turn {prompt.turn} follows {prompt.turn - 1} answers, got {len(answers)}")
    said = [tokenizer.decode(a, skip_special_tokens=True).strip() for a in answers]
    if raw or not getattr(tokenizer, "chat_template", None):
        text = "\n\n".join(x for pair in zip(prompt.turns, said) for x in pair)
        return encode(tokenizer, f"{text}\n\n{prompt.text}", raw=True)
    messages = []
    for question, answer in zip(prompt.turns, said):
        messages += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
    return encode_messages(tokenizer, messages + [{"role": "user", "content": prompt.text}])


class Conversations:
    """The prompts of a run, one per turn asked (``units``, a question's turns one after another),
    and their token ids: a later turn's ids are built once the turns before it have been answered
    (`answered`). With ``max_length`` (and ``vocab``; `bench`, which stops on a prompt it cannot
    ask), every first turn is built at once, and a prompt that cannot be encoded, leaves no room in
    the context window or holds a token id the model has no embedding for is refused naming it: a
    first turn before anything runs, a later turn when it is built. Without (`generate`, which
    fails such a prompt alone and names it itself), each is built when asked for."""

    def __init__(
        self, tokenizer, prompts: list[Prompt], every_turn: bool, raw: bool = False, max_length: int | None = None, vocab: int | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.units = split_turns(prompts, every_turn)
        self.raw = raw
        self.max_length, self.vocab = max_length, vocab
        self._ids: dict[int, list[int]] = {}
        self._answers: dict[int, list[int]] = {}
        if max_length is not None:
            for i, unit in enumerate(self.units):
                if unit.turn == 1:
                    self.ids(i)

    def ids(self, i: int) -> list[int]:
        """Token ids of ``units[i]``; its question's earlier turns must have been answered."""
        if i not in self._ids:
            unit = self.units[i]
            earlier = range(i - unit.turn + 1, i)  # the same question's earlier turns, just before it
            try:
                ids = turn_ids(self.tokenizer, unit, [self._answers[j] for j in earlier], self.raw)
                if self.max_length is not None:
                    check_prompt(ids, self.max_length, self.vocab)
            except NgspecError as exc:
                if self.max_length is None:
                    raise
                raise NgspecError(f"prompt {unit.label}: {exc}") from None
            self._ids[i] = ids
        return self._ids[i]

    def next_turn(self, i: int) -> int | None:
        """The index of the unit that asks ``units[i]``'s question's next turn (None: it was the last)."""
        j = i + 1
        return j if j < len(self.units) and self.units[j].turn > 1 else None

    def answered(self, i: int, token_ids: list[int]) -> None:
        """The answer to ``units[i]``; the first one given is kept (a bench's later rounds repeat it)."""
        self._answers.setdefault(i, list(token_ids))
