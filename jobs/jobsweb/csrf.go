package jobsweb

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"net/http"
)

// csrfCookie holds a browser's random nonce; a form's token is the HMAC of
// that nonce under the handler's key, so a token is good only with the
// cookie it was made for, and only this handler (this process) makes them.
const csrfCookie = "jobsweb_csrf"

// csrfGuard makes and checks the tokens of action forms, and refuses
// cross-origin requests as net/http's CrossOriginProtection does
// (Sec-Fetch-Site, then Origin against Host).
type csrfGuard struct {
	key    []byte
	origin *http.CrossOriginProtection
}

func newCSRFGuard(key []byte) csrfGuard {
	return csrfGuard{key: key, origin: http.NewCrossOriginProtection()}
}

var (
	errCSRFMissing = errors.New("the form has no CSRF token, or the browser sent no CSRF cookie: reload the page and try again")
	errCSRFBad     = errors.New("the form's CSRF token does not match this browser's cookie: reload the page and try again")
)

// token returns the token of the request's cookie nonce, setting a new
// cookie (path base/) when the request has none.
func (g csrfGuard) token(w http.ResponseWriter, r *http.Request, base string) string {
	if c, err := r.Cookie(csrfCookie); err == nil && c.Value != "" {
		return g.sign(c.Value)
	}
	var b [18]byte
	_, _ = rand.Read(b[:])
	nonce := base64.RawURLEncoding.EncodeToString(b[:])
	http.SetCookie(w, &http.Cookie{Name: csrfCookie, Value: nonce, Path: base + "/", HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
	return g.sign(nonce)
}

func (g csrfGuard) sign(nonce string) string {
	m := hmac.New(sha256.New, g.key)
	m.Write([]byte(nonce))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// check refuses a request from another origin, or whose form token is
// missing or not the one of its cookie.
func (g csrfGuard) check(r *http.Request) error {
	if err := g.origin.Check(r); err != nil {
		return err
	}
	c, err := r.Cookie(csrfCookie)
	sent := r.PostFormValue("csrf")
	if err != nil || c.Value == "" || sent == "" {
		return errCSRFMissing
	}
	if !hmac.Equal([]byte(sent), []byte(g.sign(c.Value))) {
		return errCSRFBad
	}
	return nil
}
