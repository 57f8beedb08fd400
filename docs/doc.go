// Package docs holds the project's documentation (the Markdown files beside this one); its test
// checks that every repository file or folder the design and the README name exists, so the
// request and event walks stay true as code moves.
package docs
