module github.com/go-zeromq/zmq4

go 1.21

require (
	github.com/go-zeromq/goczmq/v4 v4.2.2
	go.uber.org/goleak v1.3.0
	golang.org/x/sync v0.7.0
	golang.org/x/text v0.15.0
)
