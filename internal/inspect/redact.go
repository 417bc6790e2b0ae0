package inspect

import (
	"errors"
	"regexp"
)

var urlPassword = regexp.MustCompile(`(postgres(?:ql)?://[^:/@\s]*:)[^@\s]*@`)
var kvPassword = regexp.MustCompile(`(password=)\S+`)

// RedactURL replaces passwords in connection strings within s by "xxxxx".
func RedactURL(s string) string {
	s = urlPassword.ReplaceAllString(s, "${1}xxxxx@")
	return kvPassword.ReplaceAllString(s, "${1}xxxxx")
}

// redact drops passwords from an error message.
func redact(err error) error { return errors.New(RedactURL(err.Error())) }
