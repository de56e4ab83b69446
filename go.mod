module github.com/vivarium-sandbox/vivarium

go 1.26.8

require golang.org/x/sys v0.40.0 // indirect
