package report

import (
	"bytes"
	"testing"
)

// BenchmarkReport builds the report of each shipped trace under every
// policy and writes its page: what gpumem report does after loading the
// trace. It reports the page's size as bytes/page (the bar: under 5 s and
// 5 MB for the largest trace, gpt2_generate).
func BenchmarkReport(b *testing.B) {
	for _, name := range []string{"gpt2_train_varlen", "bert_mlm_varlen", "t5_train_varlen", "resnet50_train", "gpt2_generate", "sweep_create_dispose"} {
		tr := loadTrace(b, name)
		b.Run(name, func(b *testing.B) {
			var page bytes.Buffer
			for b.Loop() {
				d, err := Build(tr, allPolicies(), Options{})
				if err != nil {
					b.Fatal(err)
				}
				page.Reset()
				if err := d.WriteHTML(&page); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(page.Len()), "bytes/page")
		})
	}
}
