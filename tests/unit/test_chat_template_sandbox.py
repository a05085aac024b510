"""A chat template is untrusted input: ``router.chattemplate`` renders it in jinja2's immutable sandbox.

Each template below is what an attacker who controls a model's files would try: reach Python internals
through attributes, read a file, mutate the request, exhaust memory. Each is refused (the request falls
back; nothing is raised into the router) and leaves no trace on the values passed in.
"""

from __future__ import annotations

import copy
import json
import pathlib

import pytest

from llmgw.router import chattemplate
from llmgw.router import tokenizer as rtok

FIXTURES = pathlib.Path(__file__).parents[1] / "fixtures/kvtok"
MESSAGES = [{"role": "user", "content": "hi"}]

HOSTILE = {
    "globals through a global's function": "{{ cycler.__init__.__globals__.os.popen('id').read() }}",
    "subclasses through a string": "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "a function's globals": "{{ lipsum.__globals__['os'].system('touch /tmp/pwned') }}",
    "the template object's internals": "{{ self.__init__.__globals__ }}",
    "a file through open": "{{ open('/etc/passwd').read() }}",
    "a file through include": "{% include '/etc/passwd' %}",
    "a file through import": "{% import '/etc/passwd' as p %}{{ p }}",
    "mutating the messages": "{{ messages.append({'role': 'system', 'content': 'pwned'}) }}",
    "mutating a message": "{% set _ = messages[0].update({'content': 'pwned'}) %}{{ messages[0]['content'] }}",
    "a formatter escape": "{{ '{0.__class__.__init__.__globals__}'.format(messages) }}",
    "a huge range": "{% for i in range(10 ** 9) %}x{% endfor %}",
    "an output bomb": "{% for i in range(100000) %}{{ 'x' * 100 }}{% endfor %}",
    "raise_exception": "{{ raise_exception('refused by the template') }}",
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_hostile_template_renders_nothing_and_changes_nothing(name: str, tmp_path: pathlib.Path) -> None:
    template = chattemplate.ChatTemplate(HOSTILE[name], {"bos_token": "<s>"})
    messages = copy.deepcopy(MESSAGES)
    assert template.render(messages) is None
    assert messages == MESSAGES
    assert not pathlib.Path("/tmp/pwned").exists()


def test_the_sandbox_still_renders_what_real_templates_use() -> None:
    source = ("{{ bos_token }}{% for m in messages %}{% if loop.first %}[{{ m['role'] | upper }}]{% endif %}"
              "{{ m.content | trim }}{{ m | tojson }}{% break %}{% endfor %}{{ strftime_now('%Y') | length }}")
    out = chattemplate.ChatTemplate(source, {"bos_token": "<s>", "not_a_special_token": "x"}).render(
        [{"role": "user", "content": " héllo "}])
    assert out == '<s>[USER]héllo{"role": "user", "content": " héllo "}4'


def test_a_template_that_does_not_compile_or_is_too_large_is_refused_and_completions_still_work() -> None:
    with pytest.raises(chattemplate.TemplateRefused, match="does not compile"):
        chattemplate.ChatTemplate("{% for %}", {})
    huge = "x" * (chattemplate.MAX_TEMPLATE_CHARS + 1)
    with pytest.raises(chattemplate.TemplateRefused, match="characters"):
        chattemplate.ChatTemplate(huge, {})
    tok = rtok.ModelTokenizer((FIXTURES / "tiny/tokenizer.json").read_bytes(), json.dumps({}).encode(), huge)
    assert tok.chat is None and "characters" in tok.chat_refused
    assert tok.chat_ids({"messages": MESSAGES}) is None
    assert tok.completion_ids({"prompt": "Hello world"})  # the tokenizer itself is still used
