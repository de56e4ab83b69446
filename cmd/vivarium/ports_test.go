package main

import "testing"

func TestCheckDomain(t *testing.T) {
	for d, ok := range map[string]bool{
		"": true, "preview.example.com": true, "preview.example.com:8080": true, "localhost:8080": true,
		"vivarium.test": true,
		"127.0.0.1": false, "127.0.0.1:8080": false, "[::1]:8080": false, "example": false, "*.example.com": false,
		".example.com": false, "example.com.": false, "exa mple.com": false, "http://example.com": false,
	} {
		if err := checkDomain(d); (err == nil) != ok {
			t.Errorf("checkDomain(%q): %v", d, err)
		}
	}
}
