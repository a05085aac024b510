"""A model's chat template rendered as vLLM 0.32 renders it, in jinja2's immutable sandbox.

What vLLM does for ``/v1/chat/completions`` (read in vLLM 0.32's installed source,
``vllm/renderers/hf.py`` ``safe_apply_chat_template`` and ``chat_utils._parse_chat_message_content``;
transformers 5's ``utils/chat_template_utils.py`` ``_compile_jinja_template`` / ``render_jinja_template``):

* the template is compiled in ``jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True,
  lstrip_blocks=True)`` with the ``loopcontrols`` extension, a ``tojson`` filter that does not escape
  HTML (``json.dumps(x, ensure_ascii=False)``), and the globals ``raise_exception`` and ``strftime_now``;
* it is rendered with ``messages``, ``tools=None``, ``documents=None``, ``add_generation_prompt=True``
  and the tokenizer's named special tokens (``bos_token``, ``eos_token``, … as strings);
* a message's content reaches the template as a string when the template never loops over
  ``message['content']`` (vLLM's "string" content format: a list of text parts joined with newlines),
  else as a list of parts ("openai"): that format is not mimicked here, so its requests fall back.

A chat template is untrusted input (it comes with the model's files): the sandbox refuses attribute
access to internals (``__class__``, ``__globals__``, …) and any mutation of the values passed in; there
is no loader, so ``include``/``import``/``extends`` find nothing; the template and its output are bounded
in size. Rendering returns None, never raises, for anything the template does that is refused.
"""

from __future__ import annotations

import collections
import datetime
import json
import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import jinja2
import jinja2.ext
import jinja2.meta
import jinja2.nodes
import jinja2.sandbox

log = logging.getLogger(__name__)

#: A template past this many characters is refused (the largest real ones are about 30 KB).
MAX_TEMPLATE_CHARS = 256 * 1024
#: A rendered prompt past this many characters is not tokenized (the request falls back).
MAX_RENDERED_CHARS = 4 * 1024 * 1024
#: The named special tokens transformers passes to every template (``SPECIAL_TOKENS_ATTRIBUTES``).
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


class TemplateRefused(ValueError):
    """The chat template cannot be compiled or used here; the message says why."""


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


def _environment() -> jinja2.sandbox.ImmutableSandboxedEnvironment:
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                       extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


class ChatTemplate:
    """One compiled chat template and the special tokens it is rendered with."""

    def __init__(self, source: str, special_tokens: Mapping[str, str]) -> None:
        if len(source) > MAX_TEMPLATE_CHARS:
            raise TemplateRefused(f"the chat template has {len(source)} characters, more than {MAX_TEMPLATE_CHARS}")
        env = _environment()
        try:
            ast = env.parse(source)
            self._template = env.from_string(source)
        except jinja2.exceptions.TemplateError as exc:
            raise TemplateRefused(f"the chat template does not compile: {exc}") from exc
        self.content_format = content_format(ast)
        self._special = {k: v for k, v in special_tokens.items() if k in SPECIAL_TOKEN_NAMES}
        # vLLM passes reasoning_effort (None when not asked) only to a template that reads it.
        self._extra: dict[str, Any] = {}
        if "reasoning_effort" in jinja2.meta.find_undeclared_variables(ast):
            self._extra["reasoning_effort"] = None

    def render(self, messages: Sequence[Mapping[str, Any]]) -> str | None:
        """The prompt text vLLM renders for ``messages`` (add_generation_prompt), or None where it cannot be known."""
        if self.content_format != "string":
            return None
        try:
            text = self._template.render(messages=[dict(m) for m in messages], tools=None, documents=None,
                                         add_generation_prompt=True, **self._special, **self._extra)
        except Exception as exc:  # a hostile or failing template: the request falls back, the router goes on
            log.debug("chat template refused a request (%s: %s); kv_aware falls back for it", type(exc).__name__, exc)
            return None
        return text if len(text) <= MAX_RENDERED_CHARS else None


# -- the content format, as vLLM detects it (``renderers/hf.py`` ``_detect_content_format``) ----------------


def _is_var(node: jinja2.nodes.Node, name: str) -> bool:
    return isinstance(node, jinja2.nodes.Name) and node.ctx == "load" and node.name == name


def _is_attr(node: jinja2.nodes.Node, name: str, key: str) -> bool:
    if isinstance(node, jinja2.nodes.Getitem):
        return _is_var(node.node, name) and isinstance(node.arg, jinja2.nodes.Const) and node.arg.value == key
    if isinstance(node, jinja2.nodes.Getattr):
        return _is_var(node.node, name) and node.attr == key
    return False


def _is_var_or_elems(node: jinja2.nodes.Node, name: str, key: str | None = None) -> bool:
    if isinstance(node, jinja2.nodes.Filter):
        return node.node is not None and _is_var_or_elems(node.node, name, key)
    if isinstance(node, jinja2.nodes.Test):
        return _is_var_or_elems(node.node, name, key)
    if isinstance(node, jinja2.nodes.Getitem) and isinstance(node.arg, jinja2.nodes.Slice):
        return _is_var_or_elems(node.node, name, key)
    return _is_attr(node, name, key) if key else _is_var(node, name)


def _names_of(root: jinja2.nodes.Template, name: str) -> Iterator[str]:
    yield name
    related = collections.deque([name])
    seen = {name}
    while related:
        current = related.popleft()
        for assign in root.find_all(jinja2.nodes.Assign):
            if _is_var_or_elems(assign.node, current) and isinstance(assign.target, jinja2.nodes.Name):
                target = assign.target.name
                if target not in seen:
                    seen.add(target)
                    related.append(target)
                    yield target


def content_format(root: jinja2.nodes.Template) -> str:
    """"string" when no loop walks a message's content; "openai" when one does; "unknown" for a macro's loops.

    vLLM also follows message content passed into a macro; rather than mimic that, a template with
    loops inside macros is "unknown" and its requests fall back (a lost optimisation, never a wrong score).
    """
    messages = list(_names_of(root, "messages"))
    message_vars = [loop.target.name for loop in root.find_all(jinja2.nodes.For)
                    if isinstance(loop.target, jinja2.nodes.Name)
                    and any(_is_var_or_elems(loop.iter, m) for m in messages)]
    in_macros = {id(loop) for macro in root.find_all(jinja2.nodes.Macro) for loop in macro.find_all(jinja2.nodes.For)}
    for loop in root.find_all(jinja2.nodes.For):
        if any(_is_var_or_elems(loop.iter, m, "content") for m in message_vars):
            return "openai"
        if id(loop) not in in_macros and _is_var(loop.iter, "content"):
            return "openai"
    return "unknown" if in_macros else "string"
