package deploy

import "testing"

func TestScratch2(t *testing.T) {
	t.Run("more", func(t *testing.T) {
		scratch(t, "- {rule: 'has(dyn(self).u) ? true : true', message: 'x'}", "pattern: '\\{\\{|\\{%'\n                maxProperties: 3",
			`{u: null}`, `{u: {a: null}}`, `{u: {a: bb, l: ["{{ x }}"]}}`, `{u: {a: bb, extra: {q: 1}, l: [x, 3]}}`)
	})
}
