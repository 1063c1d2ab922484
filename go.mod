module github.com/gpumem/gpumem

go 1.26.8

require (
	github.com/ebitengine/purego v0.11.3
	github.com/nlpodyssey/gopickle v0.2.0
)
