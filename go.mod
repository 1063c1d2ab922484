module github.com/gpumem/gpumem

go 1.26.8
