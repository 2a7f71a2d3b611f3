package templating

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"
)

// differentialCorpus holds templates for TestDifferentialPaV on top of the
// acceptance vectors, evalCases and the fuzz seeds.
var differentialCorpus = []string{
	"{{ a }}", "{{ a ~ b }}", "{{ a / b }}", "{{ a // b }}", "{{ a % b }}", "{{ -a }}", "{{ +a }}", "{{ a ** 3 }}",
	"{{ 3 - 5 }}", "{{ 2.5 * 2 }}", "{{ 7 / 7 }}", "{{ 1e3 }}", "{{ 1.5e-7 }}", "{{ 123456789012345678.0 }}", "{{ 0.0001 }}",
	"{{ -0.0 }}", "{{ 1_000 }}", "{{ 0x10 }}", "{{ 10 // -3 }}", "{{ -10 % 3 }}", "{{ 10.5 % 3 }}", "{{ 2 ** 0.5 }}",
	"{{ true }}", "{{ false }}", "{{ True }}", "{{ none }}", "{{ None }}", "{{ [] }}", "{{ {} }}", "{{ () }}",
	"{{ 'a' + 'b' }}", "{{ 'a' ~ 1 ~ 1.5 ~ true ~ none }}", "{{ 'a' * 3 }}", "{{ 3 * 'a' }}", "{{ [1] + [2] }}",
	"{{ 'a' < 'b' }}", "{{ 1 < 2 < 3 }}", "{{ 1 == 1 }}", "{{ 'a' != 'a' }}", "{{ 1 >= 1.0 }}", "{{ [1, 2] == [1, 2] }}",
	"{{ 'a' in 'abc' }}", "{{ 1 in [1, 2] }}", "{{ 'k' in {'k': 1} }}", "{{ 3 not in [1] }}", "{{ not none }}", "{{ not [] }}",
	"{{ a and b }}", "{{ a or b }}", "{{ 0 or 'x' }}", "{{ '' and 'x' }}x", "{{ none or 1 }}", "{{ abc or def or 3 }}",
	"{{ abc is defined }}", "{{ abc is undefined }}", "{{ n is none }}", "{{ n is defined }}", "{{ a is number }}", "{{ s is string }}",
	"{{ l is sequence }}", "{{ m is mapping }}", "{{ a is odd }}", "{{ a is even }}", "{{ 9 is divisibleby 3 }}", "{{ a is sameas a }}",
	"{{ s | upper }}", "{{ s | lower }}", "{{ s | title }}", "{{ s | capitalize }}", "{{ s | length }}", "{{ s | reverse }}",
	"{{ s | replace('a', 'b') }}", "{{ s | trim }}", "{{ '  x  ' | trim }}", "{{ s | first }}", "{{ s | last }}",
	"{{ l | join(',') }}", "{{ l | length }}", "{{ l | first }}", "{{ l | last }}", "{{ l | sum }}", "{{ l | max }}", "{{ l | min }}",
	"{{ l | sort | join }}", "{{ l | reverse | join }}", "{{ l | unique | join }}", "{{ l | map('string') | join('-') }}",
	"{{ l | select('odd') | join }}", "{{ l | reject('odd') | join }}", "{{ l | list | length }}", "{{ l | batch(2) | list | length }}",
	"{{ m | dictsort | length }}", "{{ m.k }}", "{{ m['k'] }}", "{{ m.get('k') }}", "{{ m.get('zz', 'd') }}", "{{ m.keys() | list | join }}",
	"{{ m.values() | list | length }}", "{{ m.items() | list | length }}", "{{ m | length }}", "{{ m.zz }}", "{{ m.zz is defined }}",
	"{{ m.zz.yy }}", "{{ m.n.deep[0] }}", "{{ m['n']['deep'][0] }}", "{{ l[0] }}", "{{ l[-1] }}", "{{ l[10] }}", "{{ l[1:] | join }}",
	"{{ s[0] }}", "{{ s[1:3] }}", "{{ s[::-1] }}", "{{ s.upper() }}", "{{ s.split() | join('|') }}", "{{ s.startswith('i') }}",
	"{{ s.replace('a', 'b') }}", "{{ s.strip() }}", "{{ '{}!'.format(a) }}", "{{ '%s/%s' % (a, b) }}", "{{ '%d' % a }}",
	"{{ '%05.1f' | format(f) }}", "{{ f | round }}", "{{ f | int }}", "{{ '42' | int }}", "{{ 'x' | int }}", "{{ a | float }}",
	"{{ f | string }}", "{{ n | string }}", "{{ l | string }}", "{{ a | abs }}", "{{ -a | abs }}", "{{ s | wordcount }}",
	"{{ s | center(20) }}", "{{ s | indent(2) }}", "{{ 'x' | tobash }}", "{{ s | tobash }}", "{{ f | tobash }}", "{{ true | tobash }}",
	"{{ l | tojson }}", "{{ m | tojson }}", "{{ s | tojson }}", "{{ f | tojson }}", "{{ n | tojson }}", "{{ 'é\u2028<>&\\'' | tojson }}",
	"{{ range(3) | list | tojson }}", "{{ range(5, 0, -2) | list | tojson }}", "{{ dict(x=1) | tojson }}", "{{ namespace(x=1).x }}",
	"{% set x = 1 %}{{ x }}", "{% set x = a if a > 1 else b %}{{ x }}", "{% set x %}a{{ b }}{% endset %}{{ x }}",
	"{% set x, y = 1, 2 %}{{ y }}", "{% set x, y = [1, 2] %}{{ x }}", "{% for i in l %}{{ i }}{% endfor %}",
	"{% for i in l if i is number %}{{ i }}{% endfor %}", "{% for i in [] %}x{% else %}empty{% endfor %}",
	"{% for k, v in m | dictsort %}{{ k }}{% endfor %}", "{% for i in range(3) %}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{% endfor %}",
	"{% for i in range(3) %}{{ loop.revindex }}{% endfor %}", "{% for c in 'ab' %}{{ c }}{% endfor %}", "{% for x in abc %}x{% endfor %}",
	"{% if a %}t{% elif b %}u{% else %}v{% endif %}", "{% if abc %}t{% else %}f{% endif %}", "{% if m.zz %}t{% else %}f{% endif %}",
	"{% macro f(x, y=2) %}{{ x }}{{ y }}{% endmacro %}{{ f(1) }}{{ f(1, 3) }}{{ f(y=4, x=5) }}",
	"{% macro f() %}{{ caller() }}{% endmacro %}{% call f() %}body{% endcall %}",
	"{% with x = 2 %}{{ x }}{% endwith %}", "{% filter upper %}abc{% endfilter %}", "{% raw %}{{ }}{% endraw %}",
	"{{ '{{' }}", "{# comment #}x", "a\n{# c #}\nb", "a\n  {% if true %}\n  b\n  {% endif %}\nc", "x  {%- if true %} y {% endif -%}  z",
	"{{ 'x' }}\n", "x\n\n", "\n", "a\r\nb", "{% set yaml = true %}[1, 2]", "{% set yaml = true %}a: 1\nb: [x, 'y']",
	"{% set yaml = true %}{{ m | tojson }}", "{% set yaml = true %}", "{% set yaml = true %}~", "{% set yaml = true %}'x'",
	"{% set yaml = true %}1.0", "{% set yaml = true %}-5", "{% set yaml = true %}true", "{% set yaml = true %}Yes",
	"{% if true %}{% set yaml = true %}{% endif %}{{ a }}", "{% set yaml = 'x' %}", "{% set yaml = none %}a",
	"{% set yaml = false %}{{ a }}", "{{ 1 / 0 }}", "{{ 1 // 0 }}", "{{ 1 % 0 }}", "{{ 'a' + 1 }}", "{{ 1 + 'a' }}", "{{ [1] + 1 }}",
	"{{ {} < {} }}", "{{ none + 1 }}", "{{ abc + 1 }}", "{{ abc.x }}", "{{ abc[0] }}", "{{ abc() }}", "{{ a() }}", "{{ a.x }}",
	"{{ m.update({}) }}", "{{ l.append(1) }}", "{{ l.pop() }}", "{% set m.k = 1 %}", "{{ x | nofilter }}", "{{ x is notest }}",
	"{% include 'a' %}", "{% extends 'a' %}", "{% import 'a' as b %}", "{% from 'a' import b %}", "{{", "{{ }}", "{%", "{% if %}",
	"{% endif %}", "{% for %}", "{{ a b }}", "{{ 'unterminated }}", "}}", "{#", "{% set %}", "{{ a if b }}", "{{ a if false }}x",
	"{{ l | tobash }}", "{{ m | tobash }}", "{{ n | tobash }}", "{{ abc | tobash }}", "{{ abc | tojson }}", "{{ abc | default(1) }}",
	"{{ n | default(1) }}", "{{ '' | default('x', true) }}", "{{ abc | length }}", "{{ abc | upper }}", "{{ abc ~ 'x' }}",
	"{{ 'x' if abc else 'y' }}", "{{ abc == none }}", "{{ abc != 1 }}", "{{ not abc }}", "{% set q = abc %}{{ q is defined }}",
	"{{ cycler('a', 'b').next() }}", "{% set c = cycler(1, 2) %}{{ c.next() }}{{ c.next() }}{{ c.current }}", "{{ joiner()() }}",
	"{{ 9223372036854775807 }}", "{{ 2 ** 62 }}", "{{ -9223372036854775807 - 1 }}",

	// str methods
	"{{ s.find('a') }}", "{{ s.count('s') }}", "{{ s.ljust(20) }}|", "{{ s.rjust(20, '*') }}", "{{ s.zfill(20) }}",
	"{{ s.partition(' ') | join('|') }}", "{{ s.rstrip('g') }}", "{{ s.lstrip('i') }}", "{{ s.endswith('g') }}", "{{ s.title() }}",
	"{{ s.capitalize() }}", "{{ s.swapcase() }}", "{{ s.isdigit() }}", "{{ 'a\nb'.splitlines() | join('|') }}", "{{ s.rsplit(' ', 1) | join('|') }}",
	"{{ s.split(' ', 1) | join('|') }}", "{{ s.split('s') | join('|') }}", "{{ '  a  b '.split() | join('|') }}", "{{ '-'.join(['a', 'b']) }}",
	"{{ s.casefold() }}", "{{ 'a\tb'.expandtabs() }}", "{{ s.index('a') }}", "{{ s.rfind('s') }}", "{{ s.removeprefix('it') }}",
	"{{ s.removesuffix('ing') }}", "{{ s.isalnum() }}", "{{ s.isupper() }}", "{{ s.islower() }}", "{{ s.center(20, '*') }}",
	"{{ s.replace('s', 'S', 1) }}", "{{ s.upper().lower() }}", "{{ s.strip('ig') }}", "{{ s.startswith(('x', 'i')) }}",
	"{{ s.index('zz') }}", "{{ s.split('') }}", "{{ '{0}{1}{0}'.format('a', 'b') }}", "{{ '{x}'.format(x=1) }}", "{{ '{:>5}'.format('a') }}",
	"{{ a.bit_length() }}", "{{ f.is_integer() }}", "{{ (2.0).is_integer() }}",

	// filters
	"{{ s | truncate(9) }}", "{{ s | truncate(9, true) }}", "{{ s | truncate(9, end='!') }}", "{{ s | wordwrap(5) }}",
	"{{ 1000000 | filesizeformat }}", "{{ 1048576 | filesizeformat(true) }}", "{{ 'a b&c' | urlencode }}", "{{ m | urlencode }}",
	"{{ '<b>x</b>' | striptags }}", "{{ '<a>' | escape }}", "{{ '<a>' | e }}", "{{ s | format }}", "{{ '%s-%s' | format(a, b) }}",
	"{{ 'a\nb' | indent(2) }}", "{{ 'a\nb' | indent(2, true) }}", "{{ 'a\nb' | indent('> ', first=true) }}",
	"{{ l | slice(2) | list | tojson }}", "{{ l | batch(2, 'x') | list | tojson }}", "{{ [{'x': 1}, {'x': 2}] | map(attribute='x') | join }}",
	"{{ [{'x': 1}, {'x': 2}] | selectattr('x', 'odd') | list | length }}", "{{ [{'x': 1}, {'x': 2}] | rejectattr('x', 'odd') | list | length }}",
	"{{ [{'x': 1}, {'x': 2}] | sum(attribute='x') }}", "{{ [{'x': 1}, {'x': 2}] | max(attribute='x') | tojson }}",
	"{% for g in [{'x': 1}, {'x': 1}, {'x': 2}] | groupby('x') %}{{ g.grouper }}:{{ g.list | length }};{% endfor %}",
	"{{ m | dictsort(by='value') | length }}", "{{ m | items | list | length }}", "{{ 3.14159 | round(1, 'floor') }}", "{{ 3.5 | round }}",
	"{{ 2.5 | round }}", "{{ 'ff' | int(base=16) }}", "{{ 'x' | float(1.5) }}", "{{ m | count }}", "{{ s | list | length }}",
	"{{ ['b', 'A', 'a'] | sort | join }}", "{{ ['b', 'A', 'a'] | sort(case_sensitive=true) | join }}", "{{ ['b', 'A', 'a'] | unique | join }}",
	"{{ [3, 1] | sort(reverse=true) | join }}", "{{ ['a', 'B'] | max }}", "{{ l | sum(start=10) }}", "{{ -3 | abs }}", "{{ s | wordcount }}",
	"{{ 'hello' | replace('l', 'L', 1) }}", "{{ s | center(21) }}", "{{ 'x' | center }}", "{{ [1, [2, 3]] | tojson }}", "{{ 'a' | pprint }}",
	"{{ {'a': 'b'} | xmlattr }}", "{{ 'x' | forceescape }}", "{{ ['a', 'b'] | join(attribute='x') }}", "{{ s | capitalize }}",

	// YAML 1.1 corners, PyYAML vs go-yaml
	"{% set yaml = true %}y", "{% set yaml = true %}n", "{% set yaml = true %}no", "{% set yaml = true %}on", "{% set yaml = true %}off",
	"{% set yaml = true %}0o12", "{% set yaml = true %}012", "{% set yaml = true %}1_000", "{% set yaml = true %}.inf",
	"{% set yaml = true %}1e3", "{% set yaml = true %}1.0e3", "{% set yaml = true %}0x1F", "{% set yaml = true %}+1",
	"{% set yaml = true %}null", "{% set yaml = true %}Null", "{% set yaml = true %}'1'", `{% set yaml = true %}"a\tb"`,
	"{% set yaml = true %}a: 1\na: 2", "{% set yaml = true %}- a\n- b: c", "{% set yaml = true %}{a: [1, {b: null}]}",
	"{% set yaml = true %}|\n  line1\n  line2\n", "{% set yaml = true %}key: >\n  folded\n  text\n", "{% set yaml = true %}---\na: 1",
	"{% set yaml = true %}a: 1\n---\nb: 2", "{% set yaml = true %}&a [1, *a]", "{% set yaml = true %}{{ 'x: ' ~ (l | tojson) }}",
	"{% set yaml = true %}{{ 1e16 | tojson }}", "{% set yaml = true %}{{ f | tojson }}", "{% set yaml = true %}[1, 2, 3]\n\n",

	// loops, macros, blocks
	"{% for i in l %}{{ loop.previtem is defined }}{{ loop.nextitem is defined }}{% endfor %}",
	"{% for i in l %}{% for j in l %}{{ loop.depth }}{% endfor %}{% endfor %}",
	"{% for i in [1, 1, 2] %}{{ loop.changed(i) }}{% endfor %}",
	"{% for i in l %}{{ loop.cycle('x', 'y') }}{% endfor %}",
	"{% macro f(a, b=2) %}{{ a }}-{{ b }}-{{ varargs | length }}-{{ kwargs | length }}{% endmacro %}{{ f(1, 2, 3, k=4) }}",
	"{% macro f(x) %}<{{ caller(x) }}>{% endmacro %}{% call(y) f(5) %}{{ y }}{% endcall %}",
	"{% block b %}B{% endblock %}|{{ self.b() }}", "{% set ns = namespace(items=[]) %}{% set ns.items = ns.items + [1] %}{{ ns.items | length }}",
	"{% for x in m %}{{ x }}{% endfor %}", "{% for k, v in m.items() %}{{ k }}{% endfor %}", "{% for a, b in [[1, 2]] %}{{ a }}{{ b }}{% endfor %}",
	"{% set x = 1 %}{% macro f() %}{{ x }}{% endmacro %}{% set x = 2 %}{{ f() }}",
	"{% with a = 5 %}{% set a = 6 %}{{ a }}{% endwith %}{{ a }}", "{% if true %}{% set z = 1 %}{% endif %}{{ z }}",
	"{% for i in range(2) %}{% set z = i %}{% endfor %}{{ z is defined }}",
	"{{ l | selectattr('real') | list }}", "{{ 'abc' is lower }}", "{{ 'ABC' is upper }}", "{{ none is none }}",
	"{{ (1, 2) }}", "{{ [1, 2][5] is defined }}", "{{ 'x' in none }}", "{{ m['n'].deep }}", "{{ m.n['deep'][0] }}",

	// where pav's code and gonja's could be told apart: code points, optional
	// arguments, None against Undefined
	"{{ 'αβγ'.find('γ') }}", "{{ s.find('s', 5) }}", "{{ s.find('s', -3) }}", "{{ s.find('zz') }}", "{{ s.find('i', 1, 3) }}",
	"{{ s.rfind('s', 0, 5) }}", "{{ 'αβγα'.rfind('α') }}", "{{ s.rfind('') }}", "{{ s.rindex('s') }}", "{{ 'αβγα'.rindex('α') }}",
	"{{ s.rindex('zz') }}", "{{ s.rjust(20) }}", "{{ 'é'.rjust(3, '*') }}", "{{ s.rjust(2) }}", "{{ s.rjust(20, '**') }}",
	"{{ s.rjust() }}", "{{ [{'x': 1}, {'x': 2}] | min(attribute='x') | tojson }}", "{{ ['b', 'A', 'a'] | min }}",
	"{{ ['b', 'A'] | min(case_sensitive=true) }}", "{{ [] | min }}", "{{ 'cab' | min }}", "{{ {'b': 1, 'a': 2} | min }}",
	"{{ [1, 2.5, -3] | min }}", "{{ [1, 'a'] | min }}", "{{ n is undefined }}", "{{ m.zz is undefined }}", "{{ l[10] is undefined }}",
	"{{ abc is none }}", "{{ m.zz is none }}", "{{ false is none }}", "{{ 0 is none }}", "{{ '' is none }}",
	"{{ nil }}", "{{ nil is defined }}", "{{ l.0 }}", "{{ l.5 is defined }}", "{% for c in 'αβ' %}{{ c }}|{% endfor %}",
	"{% for i in l if i.x.y %}{{ i }}{% endfor %}", "{% for x in 42 %}{{ x }}{% endfor %}", "{{ 'αβγ'[1:] }}", "{{ 'αβγ'[-1] }}",
	"{% macro f(a, b) %}{{ a }}{{ b is defined }}{% endmacro %}{{ f(1) }}", "{% macro f() %}{{ varargs | join }}{% endmacro %}{{ f(1, 2) }}",
	"{% macro f() %}{{ kwargs | length }}{% endmacro %}{{ f(k=1) }}", "{% for i in l %}{{ loop.previtem }}{% endfor %}",
	"{{ 'x' if false }}", "{{ 1.0 }}", "{{ 1e20 }}", "{{ 1 / 3 }}", "{{ 2 ** 100 }}", "{{ true ~ false }}", "{{ none ~ 1 }}",
	"{{ 1e308 * 10 }}", "{{ -1e308 * 10 }}", "{{ 1e6 }}", "{{ 123456.789e3 }}", "{{ 1e-5 }}", "{{ 0.1 + 0.2 }}", "{{ 1e15 + 0.3 }}",
	"{{ dict(a=1, b='x') | tojson }}", "{{ dict() | length }}", "{{ dict({'a': 1}) | tojson }}", "{{ dict(a=none).a is none }}",
	"{{ dict(b=1, a=2) | list | join }}", "{{ 0a }}", "{% set 0a = 1 %}", "{{ a.0a }}", "{% for 1x in l %}{% endfor %}", "{{ f(0a=1) }}",
	"{{ abc - 1 }}", "{{ none - 1 }}", "{{ 'a' - 1 }}", "{{ [1] - [1] }}", "{{ 1 - 0.5 }}", "{{ -9223372036854775807 - 2 }}", "{{ true - 1 }}",
	"{{ 1.5 - true }}", "{{ abc != none }}", "{{ none != none }}", "{{ 1 != 1.0 }}", "{{ [1] != [1.0] }}", "{{ 'a' != none }}",
	"{{ {'a': 1} != {'a': 1} }}", "{{ true != 1 }}", "{{ m.zz != m.yy }}", "{{ 1 <= 'a' }}", "{{ [1, 2] <= [1, 3] }}", "{{ 'a' >= 'B' }}",
	"{{ none >= 1 }}", "{{ abc <= 1 }}", "{{ {} >= {} }}", "{{ 1 <= 1.0 }}", "{{ true >= 1 }}", "{{ [1, 'a'] >= [1, 2] }}", "{{ 'é' >= 'z' }}",
	"{{ not 0.0 }}", "{{ not {} }}", "{{ not 'a' }}", "{{ not m.zz }}", "{{ not ' ' }}", "{{ not [0] }}", "{{ not namespace() }}",
	"{{ -abc }}", "{{ -'a' }}", "{{ -none }}", "{{ +true }}", "{{ -true }}", "{{ -(-9223372036854775807 - 1) }}", "{{ -[1] }}", "{{ -m.zz }}",
	"{% if {} %}t{% else %}f{% endif %}", "{% if 0.0 %}t{% else %}f{% endif %}", "{% if none %}t{% else %}f{% endif %}",
	"{% if '' %}t{% else %}f{% endif %}", "{% if [0] %}t{% else %}f{% endif %}", "{% if ' ' %}t{% else %}f{% endif %}",
	"{% if dict() %}t{% else %}f{% endif %}", "{% if namespace() %}t{% else %}f{% endif %}", "{% if m.n %}t{% else %}f{% endif %}",
	"{% for x in [0, '', none, [], {}, 'a', 1] if x %}{{ x }}{% endfor %}", "{% if 'a' if false %}t{% else %}f{% endif %}",
	"{{ 'y' if {} else 'n' }}", "{{ 'y' if m.zz else 'n' }}", "{% if l | select('odd') %}t{% endif %}", "{% if range(0) %}t{% else %}f{% endif %}",
	"{% if range %}t{% else %}f{% endif %}", "{% macro m() %}{% endmacro %}{% if m %}t{% else %}f{% endif %}", "{{ 'y' if l.copy else 'n' }}",
	"{{ l | map('nosuchfilter') | join }}", "{{ [none, 1] | sort | join }}", "{{ [[1], 'a'] | sort | join }}", "{{ [1, 'a'] | sum }}",
	"{{ none | first }}", "{{ 5 | batch(2) | list }}", "{{ 5 | list }}", "{{ 'abc' | slice(0) | list }}", "{{ l | batch(0) | list }}",
	"{{ l | slice(0) | list }}", "{{ none | length }}", "{{ 42 | length }}", "{{ l | map(attribute=none) | list }}", "{{ [] | first }}",
	"{{ 1e15 }}", "{{ 1e16 }}", "{{ 0.00001 }}", "{{ 1e22 }}", "{{ 5e-324 }}", "{{ 1.7976931348623157e308 }}", "{{ -1.5e-10 }}",
	"{{ 100.0 }}", "{{ 1234567890123456.7 }}", "{{ 12345678901234567.0 }}", "{{ [1.5, 1e16, -0.0, 1e-7] | string }}", "{{ 1e-7 | tojson }}",
	"{{ 2.5e15 ~ '|' ~ 9999999999999998.0 ~ '|' ~ 0.1 }}", "{{ 1e308 * 10 | string }}", "{{ (1e308 * 10) | tojson }}",
}

// conditionalCorpus holds conditional expressions (`x if c else y`) in every
// position Jinja allows them (issue 36: gonja parsed them only at the top of
// {{ … }}), with and without else, nested, with filters and tests inside,
// with undefined names and failing expressions in the branch not taken
// (Jinja does not evaluate it) and in the one taken, and the places where
// Jinja refuses them.
var conditionalCorpus = []string{
	// parentheses, ~ and arithmetic
	"{{ (a ~ (b if c else d)) }}", "{{ (s if t else abc) ~ '!' }}", "{{ 'x' ~ (a if false else b) ~ 'y' }}", "{{ a ~ (b if false) }}",
	"{{ 1 + (2 if t else 3) * 4 }}", "{{ -(a if t else b) }}", "{{ (a if t else b) ** 2 }}", "{{ 10 // (3 if t else 0) }}",
	"{{ 1 + 2 if false else 3 }}", "{{ 'a' ~ 'b' if false else 'c' }}", "{{ a < b if t else c }}", "{{ (a if t else b) == 2 }}",
	"{{ a in (l if t else []) }}", "{{ ((a if t else b) if (c if false else t) else abc) }}",
	// nested, and the keywords' own precedence
	"{{ a if false else b if false else c }}", "{{ a if b if false else c }}", "{{ a if false else b if false }}",
	"{{ 1 if t else 2 if abc.x else 3 }}", "{{ 'a' if 'b' if 'c' }}", "{{ (a if false) is defined }}", "{{ (a if t) is defined }}",
	"{{ a or b if false else c }}", "{{ 0 or b if t else c }}", "{{ a and b if n else c and 0 }}", "{{ not t if t else 1 }}",
	"{{ a if t and n else b }}", "{{ a if not abc else b }}", "{{ a if (b or abc) else c }}",
	// filters
	"{{ s if t else abc | upper }}", "{{ (s if t else abc) | upper }}", "{{ abc if false else s | upper }}",
	"{{ l | join(', ' if t else '-') }}", "{{ abc | default('x' if t else 'y') }}", "{{ (n if false) | default('d') }}",
	"{{ l | map('string' if t else 'int') | join }}", "{{ s | replace('a' if false else 'i', 'I') }}", "{{ l | join(abc if false else '+') }}",
	// tests
	"{{ 'y' if abc is defined else 'n' }}", "{{ 'y' if a is divisibleby 2 else 'n' }}", "{{ a is divisibleby 2 if t else 0 }}",
	"{{ 'y' if l is sequence and l | length > 2 else 'n' }}", "{{ (a if t else b) is odd }}", "{{ 'y' if a is not none else 'n' }}",
	"{{ a is sameas b if t else 0 }}", "{{ (m.if is defined) if t else 0 }}",
	// calls and methods
	"{{ range(a if t else 10) | list | join }}", "{{ dict(k=1 if t else 2).k }}", "{{ s.split(' ' if t else ',') | length }}",
	"{{ '{}-{}'.format(a if t else b, b if false else c) }}", "{{ (s.upper if t else s.lower)() }}", "{{ namespace(v=a if t).v }}",
	// list, tuple and dict literals
	"{{ [a if t else b, b if false] | length }}", "{{ [a if t else b, c] | join(',') }}", "{{ {'k': a if t else b}.k }}",
	"{{ {('k' if t else 'j'): 1} | tojson }}", "{{ (a if t else b, c) | join }}", "{{ [a if false] | first is defined }}",
	// subscripts and slices
	"{{ l[0 if t else 1] }}", "{{ l[1 if false else 0:] | join }}", "{{ m['k' if t else 'zz'] }}", "{{ s[:3 if t else 1] }}",
	"{{ l[abc if false else -1] }}", "{{ l[::-1 if t else 1] | join }}",
	// macros
	"{% macro f(x, y=1 if t else 2) %}{{ x }}{{ y }}{% endmacro %}{{ f(a if false else b) }}{{ f(0, y=3 if t) }}",
	"{% macro f(x) %}{{ x if x else 'none' }}{% endmacro %}{{ f(0) }}{{ f(1) }}", "{% macro f(x=abc if false) %}{{ x is defined }}{% endmacro %}{{ f() }}",
	// statements
	"{% set v = a if t else b %}{{ v }}", "{% set v, w = (1 if t else 2), 3 if false else 4 %}{{ v }}{{ w }}",
	"{% set v = abc if false %}{{ v is defined }}", "{% with v = a if false else b %}{{ v }}{% endwith %}",
	"{% if (a if t else 0) %}y{% else %}n{% endif %}", "{% if t %}{% elif (a if t else 0) %}{% endif %}x", "{% for i in (l if t else []) %}{{ i }}{% endfor %}",
	"{% for i in l if (i if t else 0) > 1 %}{{ i }}{% endfor %}", "{% for i in l if i > 1 if t else false %}{{ i }}{% endfor %}",
	"{% for i in l if i > 1 if false %}{{ i }}{% endfor %}", "{% filter replace('a', 'b' if t else 'c') %}abc{% endfilter %}",
	"{% set yaml = true if t else false %}[1]", "{% set ns = namespace(v=0) %}{% set ns.v = a if t else b %}{{ ns.v }}",
	// refused as Jinja refuses them
	"{{ a if t else b else c }}", "{{ (a if t) else b }}", "{{ a if }}", "{{ a if t else }}", "{{ a else b }}", "{{ if a }}",
	"{% if a if t else 0 %}y{% endif %}", "{% if t %}{% elif a if t else 0 %}{% endif %}", "{% for i in l if t else [] %}{{ i }}{% endfor %}",
	"{% filter upper if t %}x{% endfilter %}", "{% macro f() %}{{ caller() }}{% endmacro %}{% call f() if t else f() %}x{% endcall %}",
	"{{ a is defined if t else 0 }}", "{% set v = a if t else b, c %}{{ v }}", "{% macro f(x if t) %}{% endmacro %}",
	// the taken branch: undefined names and errors count
	"{{ abc if t else 1 }}", "{{ abc.x if t else 1 }}", "{{ 1 if abc.x else 2 }}", "{{ 1 if m.zz else 2 }}", "{{ (abc if t else 1) | default(5) }}",
	"{{ 1 / 0 if false else 1 }}", "{{ 1 if t else 1 / 0 }}", "{{ 1 if t else abc() }}", "{{ abc() if false else 'ok' }}", "{{ 1 if t else 1 / 0 }}",
	"{{ 1 / 0 if t else 1 }}", "{{ 1 if 1 / 0 else 2 }}", "{{ 1 if none + 1 else 2 }}",
	// if and else as names, in strings, comments and raw blocks
	"{{ if if t else 5 }}", "{{ (if if false else 5) }}", "{{ 'if' if t else 'else' }}", "{{ ('(' if t else ')') ~ ')' }}",
	"{% set else = 1 %}{{ else if t }}", "{{ m.else if t else 0 }}", "{{ not if if t }}", "{# (a if b) #}x", "{% raw %}{{ a if b }}{% endraw %}",
	"x {{- a if t else b -}} y", "{{ m.n.deep[0] if m.n else none }}",

	// found by FuzzExpressionGrammar: a failed item of a list or tuple
	// literal, a test of a failed value, Undefined through int, float and
	// abs, bool indexes, and the numeric tests with Python's %
	"{{ [a not in a, a] | join('|') }}", "{{ [1 / 0, 2] | join }}", "{{ (1 / 0, 2) | join }}", "{{ [abc.x] | length }}",
	"{% set v, w = 1 / 0, 2 %}{{ w }}", "{{ s | replace('b', (s + 1 == a) is defined) }}", "{{ (abc.x is defined) }}",
	"{{ ((abc if false) | int) + a }}", "{{ abc | int }}", "{{ abc | float }}", "{{ abc | abs }}", "{{ s | abs }}", "{{ true | abs }}",
	"{{ none | abs }}", "{{ '3' | int }}", "{{ none | int }}", "{{ l[true] }}", "{{ s[false] }}", "{{ l[a == a] }}",
	"{{ f is divisibleby 2 }}", "{{ 2.5 is divisibleby 0.5 }}", "{{ 3 is divisibleby 0 }}", "{{ 4 is divisibleby 'a' }}",
	"{{ -3 is odd }}", "{{ 3.0 is odd }}", "{{ 2.5 is even }}", "{{ true is odd }}", "{{ 'a' is odd }}", "{{ abc is odd }}",
	"{{ none is even }}", "{{ true is number }}", "{{ none is number }}", "{{ s is sequence }}", "{{ m is sequence }}",
	"{{ abc is sequence }}", "{{ 1 is sequence }}", "{{ none is sequence }}",
	"{{ s | replace('b', n) }}", "{{ 'abc' | replace(abc, 'x') }}", "{{ 12 | replace(1, 3) }}", "{{ n | upper }}", "{{ f | lower }}",
	"{{ [1, 'a'] | upper }}", "{{ n | trim }}", "{{ t | title }}", "{{ n | capitalize }}", "{{ abc | upper }}", "{{ 1 | striptags }}",
	"{{ t | int }}", "{{ t | float }}", "{{ false | int }}", "{{ (z is divisibleby 2) | int }}",
	"{{ l[abc] is defined }}", "{{ m[abc] is defined }}", "{{ s[abc] | default('d') }}", "{{ l[abc] }}", "{{ abc[abc] }}", "{{ l[none] is defined }}",
	"{{ m in m }}", "{{ l not in m }}", "{{ [1] in [[1]] }}", "{{ abc in m }}", "{{ abc in l }}",
	"{{ abc in s }}", "{{ abc not in abc }}",
	"{{ s % m }}", "{{ '%s' % m }}", "{{ 'x' % {} }}", "{{ '%s %s' % m }}", "{{ '%s' | format(m) }}", "{{ 'x' | format(m) }}",
	"{{ s % abc }}", "{{ '%s|' % abc }}", "{{ '%d' % abc }}", "{{ '%r' % abc }}", "{{ '%s|' | format(abc) }}", "{{ '%d' | format(abc) }}",
	"{{ 0.0 % -1 }}", "{{ -0.0 % 1 }}", "{{ 3.0 % -1.5 }}", "{{ -3.0 % 1.5 }}", "{{ (f - f) % -(a == a) }}",
}

// grammarCorpus holds expressions where gonja's grammar differs from
// Jinja's and the token pass (tokenpass.go, lex.go) makes pav read them as
// Jinja does, and the forms near them that Jinja refuses.
var grammarCorpus = []string{
	// line breaks and other whitespace between tokens (gonja's lexer
	// glued what it skipped to the next token), and characters Jinja refuses
	"{{ 'a' ~\n'b' }}", "{{ 1 +\n2 }}", "{{ 1 +\n 2 }}", "{{ 'a' ~\n\n'b' }}", "{{ 'a'\n~\n'b' }}", "{{\na\n}}", "{{\n-a }}",
	"{{-\na }}", "x  {{-\na\n-}}  y", "{{ a\n-}}  x", "{%\nif\na\n%}y{%\nendif\n%}", "{%- if a\n-%}\n  y\n{%- endif %}",
	"{%\nraw %}{{ x }}{% endraw %}", "{% raw %}{{ a\n$ }}{%\nendraw %}", "{# a\n$ #}x", "{%\n%}", "{%\tif a %}x{% endif %}",
	"{% for i in\nl\nif i > 1 %}{{ i }}{% endfor %}", "{% set x =\n[1,\n2] %}{{ x | join }}", "{{ [1,\n]\n| length }}",
	"{% macro f(x,\ny=1) %}{{ x }}{{ y }}{% endmacro %}{{ f(\n1\n) }}", "{{ m\n.k }}", "{{ l\n[0] }}", "{{ s\n|\nupper }}",
	"{{ a\nis\nodd }}", "{{ a\nif\nt\nelse\nb }}", "{{ a\n!= 2 }}", "{{ a !\n= 2 }}", "{{ a\n not in l }}", "{{ a not\nin l }}",
	"{{ {'a':\n1}\n.a }}", "{{ range(3)\n|\nlist\n|\njoin }}", "{{ 'a\nb' ~\n'c' }}", "{{ \"a\" ~\n\"b\\\"c\" }}", "{{ 'a' ~\n'b\\'c' }}",
	"{% set yaml = true %}script: |\n  echo {{ s\n     | tobash }}\n  echo {{ a +\nb }}\n", "{{ 1 +\r\n2 }}", "{{ 1 +\r2 }}",
	"{{ a\tb }}", "{{ 1\v+\f2 }}", "{{ 1\x1c+\x1f2 }}", "{{ 1\u00a0+\u20282 }}", "{{ 1\u3000+\u202f2 }}", "{{ 1\u200b+ 2 }}",
	"{{ 1 $+ 2 }}", "{{ 'a' ~ $'b' }}", "{{ 1 @ 2 }}", "{{ 1 ; 2 }}", "{{ 1 ? 2 }}", "{{ a\\b }}", "{{ `a` }}", "{{ 1 # 2 }}",
	"{{ 1 & 2 }}", "{{ 1 ^ 2 }}", "line1\n{{ 1 +\n\n'x' }}", "{{ 1.5\n}}", "{{ 1.\n}}", "{{ 1\n.5 }}", "{{ 1. }}", "{{ 1.+2 }}",
	"{{ [1.] }}", "{{ 1. 5 }}",
	// chained comparisons, in and not in among them
	"{{ 3 > 2 > 1 }}", "{{ 1 < 3 < 2 }}", "{{ (3 > 2) > 1 }}", "{{ 3 > (2 > 1) }}", "{{ 1 > 2 < abc.x }}", "{{ 1 < 2 < abc.x }}",
	"{{ 1 < 2 < abc }}", "{{ a < b < c < 5 }}", "{{ a < b < c < 4 }}", "{{ a == 2 == true }}", "{{ 1 < 2 == true }}",
	"{{ 1 == 1 != 2 }}", "{{ 'b' > 'a' >= 'a' <= 'b' }}", "{{ 1 < 'a' < 2 }}", "{{ 2 < 1 < 'a' }}", "{{ 1 < 2 < none }}",
	"{{ none == none == none }}", "{{ m.zz == m.yy == none }}", "{{ a < b in l }}", "{{ a in l < b }}", "{{ 1 in l in [[3, 1, 2]] }}",
	"{{ 1 in l in l }}", "{{ abc in l in l }}", "{{ a < b if t else c < a < b }}", "{{ [a < b < c, 3 > 2 > 1] | join }}",
	"{{ l[1 < 2 < 3] }}", "{{ 1 < 2 < 3 | string }}", "{{ (1 < 2 < 3) | string }}", "{{ 1 < 2 < 3 is sameas true }}",
	"{% if 1 < a < 3 %}y{% else %}n{% endif %}", "{% for i in l if 1 < i < 3 %}{{ i }}{% endfor %}", "{% set x = 1 < a < 3 %}{{ x }}",
	"{% set c = cycler(1, 2, 3) %}{{ 0 < c.next() < 5 }}{{ c.current }}", "{% set c = cycler(1, 2, 3) %}{{ 5 < c.next() < 5 }}{{ c.current }}",
	"{% set c = cycler(1, 2, 3) %}{{ 5 < 1 < c.next() }}{{ c.current }}", "{% for i in range(3) %}{{ 0 <= loop.index0 < 2 }}{% endfor %}",
	"{% macro f(x) %}{{ 0 < x < 3 }}{% endmacro %}{{ f(1) }}{{ f(5) }}",
	// the right of in and not in is an arithmetic expression
	"{{ 'a' in 'b' ~ 'a' }}", "{{ 'a' in 'ba' < true }}", "{{ 'a' not in 'b' ~ 'a' }}", "{{ a in l | list }}", "{{ a + 1 in l }}",
	"{{ a in [1] + [2] }}", "{{ a not in [1] + [2] }}", "{{ not a in l }}", "{{ a in abc }}", "{{ (1, 2) in [(1, 2)] }}",
	"{% for i in l if i in l %}{{ i }}{% endfor %}", "{% for i in l if i not in [1] %}{{ i }}{% endfor %}",
	"{% for i in l in [l] %}x{% endfor %}", "{% for in in l %}{{ in }}{% endfor %}",
	// and, or, not, in, is: keywords or names by position
	"{{ a in(1, 2) }}", "{{ a not in(1, 2) }}", "{{ not-a }}", "{{ a and(b) }}", "{{ a or(b) }}", "{{ a.in }}", "{{ a.not }}",
	"{{ a.is }}", "{{ m.and is defined }}", "{{ in }}", "{{ in is defined }}", "{{ and is defined }}", "{{ a not b }}", "{{ a not }}",
	// not not, - -x, adjacent strings
	"{{ - -a }}", "{{ -+-a }}", "{{ - - a | string }}", "{{ 1 - -a }}", "{{ 1 - - -a }}", "{{ - -s }}", "{{ a * - -1 }}", "{{ --a }}",
	"{{ - - - - 2.5 }}", "{{ +-+none }}",
	"{{ not not a }}", "{{ not not not a }}", "{{ not not abc }}", "{{ not not [] }}", "{{ not not a == 2 }}", "{{ not not not not 0 }}",
	"{{ not not a and not not b }}", "{{ a and not not b }}", "{{ (not not a) ~ 'x' }}", "{% if not not a %}y{% endif %}",
	"{{ 'a' 'b' }}", "{{ 'a' \"b\" 'c' }}", "{{ 'a' 'b' ~ 'c' }}", "{{ 'a\\n' 'b' }}", "{{ 'a\\'' 'b' }}", "{{ 'x' in 'a' 'x' }}",
	"{{ l | join('a' 'b') }}", "{{ ('a' 'b') }}", "{{ ['a' 'b', 'c'] | join }}", "{{ {'a' 'b': 1} | list | join }}",
	"{{ 'a' 'b' | upper }}", "{{ 'a' |upper 'b' }}", "{{ 'a' ~ ('b' if t) 'c' }}", "{{ 'ab' is eq 'a' 'b' }}", "{{ 'a'\n'b' }}",
	// argument lists
	"{{ dict(a or b = 1) | tojson }}", "{{ dict(a.b = 1) | tojson }}", "{{ dict(a=1, 2) | tojson }}", "{{ dict(a=1, a=2) | tojson }}",
	"{{ dict(a=1, b=a) | tojson }}", "{{ dict(a=(b=1)) | tojson }}", "{{ f((a) = 1) }}", "{{ [a=1] }}", "{{ {'a'=1} }}", "{{ (a=1) }}",
	"{{ dict(not=1) | list | join }}", "{{ dict(in=1, is=2) | list | join }}", "{{ dict(and=3, or=4) | list | join }}",
	"{{ dict(else=6, if=5) | list | join }}", "{{ dict(a=1, b=2,) | length }}", "{{ dict(a=1 b=2) | length }}",
	"{{ range(1, 2 3) | list }}", "{{ range(1 , 2,) | list | join }}", "{{ range(,) | list }}", "{{ range(1,,) | list }}",
	"{{ {'a': 1,} | length }}", "{{ {,} | length }}", "{{ [1,] | length }}", "{{ (1,) | length }}",
	"{{ l | join(d=1, d=2) }}", "{{ a is divisibleby(num=2, num=3) }}", "{{ range(3) | join('' 1) }}", "{{ range(3) | join(a b) }}",
	"{{ range(3) | join(a if t else b) }}", "{{ range(3) | join(a and b) }}", "{{ range(3) | join(a not in l) }}",
	"{{ range(3) | join(a is odd) }}", "{{ range(3) | join(a {}) }}",
	"{% macro f(a=1, a=2) %}{{ a }}{% endmacro %}{{ f() }}", "{% macro f(a, a) %}{{ a }}{% endmacro %}{{ f(1, 2) }}",
	"{% macro f(a=1, b) %}{{ a }}{% endmacro %}{{ f() }}", "{% macro f(a, b=2,) %}{{ a }}{{ b }}{% endmacro %}{{ f(1) }}", "{% macro f(a, b=2) %}{{ a }}{{ b }}{% endmacro %}{{ f(1,) }}",
	"{% macro m(a, b=2) %}{{ a }}{{ b }}{% endmacro %}{{ m(b=3, a=1) }}", "{% macro m(a, b=2) %}{{ a }}{{ b }}{% endmacro %}{{ m(b=3, 1) }}",
	// autoescape takes an expression
	"{% autoescape 1 %}{{ '<' }}{% endautoescape %}", "{% autoescape a > 1 %}{{ '<' }}{% endautoescape %}",
	"{% autoescape %}{{ '<' }}{% endautoescape %}", "{% autoescape true %}{% set x = '<' %}{% endautoescape %}{{ x }}",
	"{% autoescape true %}{{ s }}{{ '\"&>' }}{% endautoescape %}", "{% autoescape 1 if false %}{{ '<' }}{{ s }}{% endautoescape %}",
	"{% autoescape 1 if true %}{{ '<' }}{{ s }}{% endautoescape %}", "{% autoescape 1 / 0 %}{{ '<' }}{% endautoescape %}",
	"{% autoescape [] %}{{ '<' }}{% endautoescape %}", "{% autoescape [0] %}{{ '<' }}{% endautoescape %}",
	"{% autoescape not false %}{{ '<' }}{% endautoescape %}", "{% autoescape 'a' in 'abc' %}{{ '<' }}{% endautoescape %}",
	"{% autoescape (true) %}{{ '<' }}{% endautoescape %}", "{% autoescape none %}{{ '<' }}{% endautoescape %}",
	"{% autoescape 1 < 2 < 3 %}{{ '<' }}{% endautoescape %}", "{% autoescape true, false %}{{ '<' }}{% endautoescape %}",
	"{% autoescape true %}{% autoescape false %}{{ '<' }}{% endautoescape %}{{ '<' }}{% endautoescape %}",
	"{% autoescape true %}{{ '<' | upper }}{{ ['<'] | join }}{{ '<%s' % 1 }}{% endautoescape %}",
	"{% macro g() %}{{ '<' }}{% endmacro %}{% autoescape true %}{{ g() }}{% endautoescape %}",
	"{% macro g() %}<{% endmacro %}{% autoescape true %}{{ g() }}{% endautoescape %}", "{% macro g() %}<{% endmacro %}{{ g() }}",
	"{% autoescape true %}{{ '<' | tobash }}{% endautoescape %}", "{% autoescape true %}{{ 1 }}{{ none is none }}{% endautoescape %}",
	"{% autoescape true %}{% filter upper %}<{{ '<' }}{% endfilter %}{% endautoescape %}",
	"{% autoescape true %}{% set yaml = true %}{{ '<' }}{% endautoescape %}", "{% autoescape true -%} {{ '<' }} {%- endautoescape %}",
	"{% autoescape true %}{{ 'a' ~ '<' }}{{ '<' | e }}{{ '<' | safe ~ '<' }}{% endautoescape %}",
	"{% autoescape true %}{{ '<' }}", "{% autoescape true %}{{ '<' }}{% endautoescape x %}",
	"{% autoescape true %}{% macro g() %}<{% endmacro %}{{ g() }}{% endautoescape %}",
	// tests bind as tightly as filters: to the operand before is
	"{{ 1 + 1 is odd }}", "{{ 2 * 3 is odd }}", "{{ -1 is odd }}", "{{ a ** 2 is odd }}", "{{ 2 ** a is even }}",
	"{{ a is odd + 1 }}", "{{ a is odd < b }}", "{{ a is odd == b is odd }}", "{{ not a is odd }}", "{{ l[0] is odd ~ 'x' }}",
	"{{ a is divisibleby(2) is odd }}", "{{ x is sameas y is none }}", "{{ a is number() is number }}", "{{ a is eq a is eq true }}",
	"{{ a is divisibleby 2 + 1 }}", "{{ a is not divisibleby 2 + 1 }}", "{{ a is lt b * 2 }}", "{{ a is ge 2 }}",
	"{{ a is not odd | string }}", "{{ a | string is string }}", "{{ l | select('odd') | list is sequence }}",
	"{{ m | dictsort | first is sequence }}", "{{ l is sequence and a is odd }}", "{{ (a is odd) ~ (b is odd) }}",
	"{{ a is sameas b.c }}", "{{ m.k is eq m['k'] }}", "{{ m is mapping and m.n.deep[0] is sameas true }}",
	"{{ a is divisibleby (2) }}", "{{ a is divisibleby [2][0] }}", "{{ a is eq {'a': 1}.a }}", "{{ a is defined() }}",
	"{{ 'x' is in 'xy' }}", "{{ 'x' is not in 'xy' }}", "{{ a is sameas if }}", "{{ 'y' if a is defined else 'n' }}",
	"{% if a is odd %}y{% else %}n{% endif %}", "{% for i in l if i is odd %}{{ i }}{% endfor %}",
	"{{ a is odd is even }}", "{{ a is not none is none }}", "{{ a is number is number }}", "{{ a is not not odd }}",
	"{{ 1 if a is defined if b }}", "{{ a is defined else 'n' }}", "{{ a is sameas -1 }}", "{{ a is }}", "{{ a is ( }}",
	"{{ a is 'x' }}", "{{ is }}", "{% filter upper is odd %}x{% endfilter %}",
	// the comparison tests compare as the operators do
	"{{ ['a', 1] | select('odd') | join }}", "{{ ['a', 1] | select('lt', 2) | join }}", "{{ x is sameas y }}",
	"{{ l['x'] is sameas none }}", "{{ abc is sameas none }}", "{{ abc is sameas abc }}", "{{ n is sameas none }}",
	"{{ a is sameas 2 }}", "{{ m.zz is sameas m.zz }}", "{{ [] is sameas [] }}", "{{ l is sameas l }}", "{{ 'a' is sameas 'a' }}",
	"{{ 1.5 is sameas 1.5 }}", "{{ true is sameas true }}", "{{ 300 is sameas 300 }}", "{{ -5 is sameas -5 }}", "{{ 0 is sameas false }}",
	"{{ range(*l) | list | join }}", "{{ dict(**m) | length }}", "{% for (a, b) in [(1, 2)] %}{{ a }}{{ b }}{% endfor %}",
	"{{ 'a' is lt 3 }}", "{{ 'a' is eq 3 }}", "{{ 1 is eq 1.0 }}", "{{ abc is eq 1 }}", "{{ abc is lt 1 }}", "{{ a is gt 2 }}",
	"{{ a is le 2 }}", "{{ a is ne 2 }}", "{{ a is equalto 2 }}", "{{ a is lessthan 3 }}", "{{ a is greaterthan 3 }}",
	"{{ [1] is eq [1] }}", "{{ a is eq }}", "{{ a is eq(1, 2) }}", "{{ none is lt 1 }}", "{{ l | select('lt', 2) | join }}",
	"{{ l | select('<', 2) | join }}", "{{ l | reject('eq', 1) | join }}",
	// a test takes the arguments Jinja's does
	"{{ a is defined(1) }}", "{{ a is defined in -1 }}", "{{ a is divisibleby(num=2) }}", "{{ a is divisibleby(n=2) }}",
	"{{ a is divisibleby(2, num=2) }}", "{{ a is divisibleby }}", "{{ a is sameas(other=a) }}", "{{ a is in(seq=l) }}",
	"{{ a is eq(b=2) }}", "{{ a is odd(x=1) }}", "{{ a is number(1) }}", "{{ l | select('divisibleby', 3) | join }}",
	"{{ a is escaped }}", "{{ '<' | safe is escaped }}", "{{ '<' | e is escaped }}", "{{ 'upper' is filter }}", "{{ 'pav:var' is filter }}",
	"{{ 'nosuch' is filter }}", "{{ 1 is filter }}", "{{ [1] is filter }}", "{{ 'odd' is test }}", "{{ 'in' is test }}", "{{ none is test }}",
	"{{ abc is test }}", "{{ a is callable }}", "{{ a is boolean }}", "{{ a is integer }}", "{{ a is float }}", "{{ a is true }}",
	"{{ a is iterable }}",
}

// knownDeviations are templates whose result differs from PaV's on purpose
// (or because of a gonja limitation that is not worth working around); the
// reason is reported in the test log.
var knownDeviations = map[string]string{
	"{{ 9223372036854775807 + 1 }}":                          "Python has big integers; pav fails on 64-bit overflow",
	"{{ 2 ** 100 }}":                                         "Python has big integers; pav fails on 64-bit overflow",
	"{{ [none, 1] | sort | join }}":                          "gonja's sort orders mixed types where Python fails (found in issue 13, not worked around)",
	"{{ [[1], 'a'] | sort | join }}":                         "gonja's sort orders mixed types where Python fails (found in issue 13, not worked around)",
	"{{ [1, 'a'] | sum }}":                                   "gonja's sum skips what is not a number where Python fails (found in issue 13, not worked around)",
	"{{ none | first }}":                                     "gonja's first gives '' for what is not a sequence where Python fails (found in issue 13, not worked around)",
	"{{ none | length }}":                                    "gonja's length gives 0 for what has no length where Python fails (found in issue 13, not worked around)",
	"{{ 42 | length }}":                                      "gonja's length gives 0 for what has no length where Python fails (found in issue 13, not worked around)",
	"{{ [] | first }}":                                       "gonja's first of an empty list is '', Jinja's is Undefined (found in issue 13, not worked around)",
	"{{ -9223372036854775807 - 2 }}":                         "Python has big integers; pav fails on 64-bit overflow",
	"{{ -(-9223372036854775807 - 1) }}":                      "Python has big integers; pav fails on 64-bit overflow",
	"{{ dict({'a': 1}) | tojson }}":                          "pav's dict() takes keyword arguments only",
	"{{ dict(b=1, a=2) | list | join }}":                     "Python dicts keep insertion order; pav's are Go maps and iterate in key order",
	"{{ dict(in=1, is=2) | list | join }}":                   "Python dicts keep insertion order; pav's are Go maps and iterate in key order",
	"{#":                                                     "Jinja ignores an unclosed comment at the end; pav reports it",
	"{{ ['a', 1] | select('odd') | join }}":                  "gonja's select, reject, selectattr and rejectattr count a test's error as false; Jinja fails",
	"{{ ['a', 1] | select('lt', 2) | join }}":                "gonja's select, reject, selectattr and rejectattr count a test's error as false; Jinja fails",
	"{{ 'a' is sameas 'a' }}":                                "CPython interns string constants; pav's strings are never the same object",
	"{{ range(*l) | list | join }}":                          "gonja's parser takes no *args or **kwargs in calls",
	"{{ dict(**m) | length }}":                               "gonja's parser takes no *args or **kwargs in calls",
	"{% for (a, b) in [(1, 2)] %}{{ a }}{{ b }}{% endfor %}": "gonja's for tag takes no parenthesized targets",
	"{% autoescape a > 1 %}{{ '<' }}{% endautoescape %}":     "pav takes only a literal autoescape value: Jinja escapes constant output by the value it knows at compile time, and other output by the value at run time",
	"{% autoescape true %}{% macro g() %}<{% endmacro %}{{ g() }}{% endautoescape %}": "PaV's finalize makes every output a plain str, so that Jinja escapes safe strings (Markup) again; pav does not",
	"{% if false %}{{ 1 | nosuch }}{% endif %}":                                       "Jinja 3 defers unknown filters in conditionals to run time; pav rejects them at load time",
	"{% if false %}{{ 1 is nosuch }}{% endif %}":                                      "Jinja 3 defers unknown tests in conditionals to run time; pav rejects them at load time",
	"{{ s | wordwrap(5) }}":                                                           "gonja's wordwrap does not implement Python's textwrap",
	"{{ m | dictsort(by='value') | length }}":                                         "gonja's dictsort orders mixed types where Python fails",
	"{% set yaml = true %}.inf":                                                       "(the reference cannot print infinity as JSON)",
	"{{ l.pop() }}":                                                                   "Jinja's immutable sandbox forgets list.pop (it refuses dict.pop and set.pop); pav refuses every mutating method, since the context is shared with the driver",
	"{% macro f(x) %}<{{ caller(x) }}>{% endmacro %}{% call(y) f(5) %}{{ y }}{% endcall %}":                           "gonja's call tag takes no parameters",
	"{% set yaml = true %}[y, n, yes, No, on, OFF, 012, 0o12, 0x1F, 1_000, 1e3, 1.5e+3, 1.0, ~, '1', 2020-01-02, 08]": "PyYAML makes a date (which PaV's client sent as a string); pav keeps the string",
}

// pythonCandidates are the interpreters TestDifferentialPaV tries, in order:
// Debian's (where apt's python3-jinja2 and python3-yaml install, and what
// .ci/run installs them for), then whatever python3 is first on PATH (which may
// be a pyenv or virtualenv one without them).
var pythonCandidates = []string{"/usr/bin/python3", "python3"}

// referencePython returns the first candidate that imports jinja2 and yaml, or
// "" and why each candidate was passed over.
func referencePython() (string, []string) {
	var why []string
	for _, c := range pythonCandidates {
		py, err := exec.LookPath(c)
		if err != nil {
			why = append(why, c+": not found")
			continue
		}
		if out, err := exec.Command(py, "-c", "import jinja2, yaml").CombinedOutput(); err != nil {
			// The last line of the traceback names the missing module.
			lines := strings.Split(strings.TrimSpace(string(out)), "\n")
			reason := lines[len(lines)-1]
			if reason == "" {
				reason = err.Error()
			}
			why = append(why, py+": "+reason)
			continue
		}
		return py, nil
	}
	return "", why
}

// TestDifferentialPaV compares pav's results with PaV's own implementation
// (testdata/pav_reference.py, Jinja 3 + PyYAML) on every template of the
// test suite: both must succeed with equal values, or both must fail. Without
// a python3 that has jinja2 and yaml it is skipped, except in CI (CI=true),
// where it fails: CI must run it.
func TestDifferentialPaV(t *testing.T) {
	py, why := referencePython()
	if py == "" {
		msg := "no python3 with jinja2 and yaml (apt-get install python3-jinja2 python3-yaml): " + strings.Join(why, "; ")
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	t.Logf("reference: %s", py)

	vars := Vars{
		"a": int64(2), "b": int64(3), "c": int64(4), "f": 1.5, "s": "it's a string", "n": nil, "t": true,
		"l": []any{int64(3), int64(1), int64(2)},
		"m": map[string]any{"k": "v", "n": map[string]any{"deep": []any{true}}},
	}
	type tc struct {
		tmpl string
		vars Vars
	}
	var cases []tc
	seen := map[string]bool{}
	add := func(tmpl string, v Vars) {
		// Kubernetes strings are valid UTF-8 (and JSON could not carry
		// anything else to the reference).
		if !seen[tmpl] && utf8.ValidString(tmpl) {
			seen[tmpl] = true
			cases = append(cases, tc{tmpl, v})
		}
	}
	for _, s := range differentialCorpus {
		add(s, vars)
	}
	for _, s := range conditionalCorpus {
		add(s, vars)
	}
	for _, s := range grammarCorpus {
		add(s, vars)
	}
	for _, c := range evalCases {
		// Resource limits are pav's own (PaV would build gigabytes).
		if !limitError.MatchString(c.wantErr) {
			add(c.tmpl, evalVars)
		}
	}

	var in bytes.Buffer
	for _, c := range cases {
		line, err := json.Marshal(map[string]any{"tmpl": c.tmpl, "vars": c.vars})
		if err != nil {
			t.Fatal(err)
		}
		in.Write(line)
		in.WriteByte('\n')
	}
	cmd := exec.Command(py, "testdata/pav_reference.py")
	cmd.Stdin = &in
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("reference: %v", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 64<<20)
	e := New(Options{})
	mismatches := 0
	for i := 0; sc.Scan(); i++ {
		c := cases[i]
		dec := json.NewDecoder(bytes.NewReader(sc.Bytes()))
		dec.UseNumber()
		var ref map[string]any
		if err := dec.Decode(&ref); err != nil {
			t.Fatal(err)
		}
		got, gotErr := e.EvaluateString(context.Background(), c.tmpl, c.vars)
		diff := referenceDiff(ref, got, gotErr)
		if diff == "" {
			continue
		}
		if reason, ok := knownDeviations[c.tmpl]; ok {
			t.Logf("known deviation %q: %s (%s)", c.tmpl, diff, reason)
			continue
		}
		mismatches++
		t.Errorf("%q: %s", c.tmpl, diff)
	}
	t.Logf("%d templates compared, %d unexpected differences", len(cases), mismatches)
}

// referenceDiff compares pav's result with the reference's answer
// ({"ok": value} or {"err": message}): "" when both succeed with equal
// values or both fail, else what differs.
func referenceDiff(ref map[string]any, got any, gotErr error) string {
	refVal, refOK := ref["ok"]
	switch {
	case refOK && gotErr != nil:
		return "PaV gives " + jsonString(refVal) + ", pav fails: " + gotErr.Error()
	case !refOK && gotErr == nil:
		return "PaV fails (" + fmt.Sprint(ref["err"]) + "), pav gives " + jsonString(got)
	case refOK && !reflect.DeepEqual(Normalize(refVal), got):
		return "PaV gives " + jsonString(refVal) + ", pav gives " + jsonString(got)
	}
	return ""
}

var limitError = regexp.MustCompile(`too large|exceeds|too deeply|range too big|recursion depth|out of range`)

func jsonString(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return strings.TrimSpace(err.Error())
	}
	return string(b)
}
