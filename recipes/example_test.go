package recipes_test

import (
	"fmt"
	"strings"

	"github.com/triadhq/triad/recipes"
)

func ExampleParse() {
	src := "---\n" +
		"name: hello\n" +
		"title: Hello\n" +
		"description: Searches, then counts the results.\n" +
		"params:\n" +
		"  topics: {type: list, default: [pricing, churn]}\n" +
		"---\n" +
		"```search\n" +
		"foreach: topics\n" +
		"query: \"B2B analytics {{ item }}\"\n" +
		"save_as: \"evidence/{{ item | slug }}.json\"\n" +
		"```\n" +
		"```python {outputs: [counts.txt]}\n" +
		"open(\"counts.txt\", \"w\").write(str(len(topics)))\n" +
		"```\n"
	r, err := recipes.Parse("hello.md", []byte(src))
	if err != nil {
		fmt.Println(err)
		return
	}
	plan, err := r.Bind(map[string]any{"topics": []any{"Pricing", "Net retention"}})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, s := range plan.Steps {
		switch s.Kind {
		case recipes.KindSearch:
			fmt.Printf("%d %s %q -> %s\n", s.N, s.Kind, s.Search.Query, s.SaveAs)
		default:
			fmt.Printf("%d %s %s\n", s.N, s.Kind, s.ID)
		}
	}
	code := plan.Steps[0].Code // the parameters cell
	fmt.Print(code[strings.Index(code, "objective ="):])

	_, err = recipes.Parse("bad.md", []byte("---\nname: bad\ntitle: Bad\ndescription: d\n---\n```search\nquery: x\ntopk: 3\nsave_as: e.json\n```\n"))
	fmt.Println(err)
	// Output:
	// 1 exec parameters
	// 2 search "B2B analytics Pricing" -> evidence/pricing.json
	// 3 search "B2B analytics Net retention" -> evidence/net-retention.json
	// 4 exec step-2
	// objective = ""
	// topics = ["Pricing", "Net retention"]
	// seed = TRIAD_SEED  # the run's seed, set by Triad when the kernel started
	// as_of = TRIAD_AS_OF  # the run's as-of date, YYYY-MM-DD, or "" for none
	// bad_input: bad.md:8: search block: unknown field "topk"
}
