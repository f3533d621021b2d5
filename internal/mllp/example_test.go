package mllp_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"syscall"
	"time"

	"github.com/mefor/mefor/internal/mllp"
)

func Example() {
	srv := &mllp.Server{
		// A real handler stores msg durably and builds an ACK from its
		// header, returning nil if it could not store it.
		Handler: mllp.HandlerFunc(func(ctx context.Context, msg []byte, conn mllp.ConnInfo) []byte {
			return []byte("MSH|^~\\&|||||||ACK||P|2.5\rMSA|AA|1\r")
		}),
		ReadTimeout: 30 * time.Second,
	}
	// net.Listen rather than ListenAndServe, to learn the port chosen for :0.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	go func() {
		if err := srv.Serve(ln); !errors.Is(err, mllp.ErrServerClosed) {
			log.Print(err)
		}
	}()

	client := &mllp.Client{Addr: ln.Addr().String(), AckTimeout: 10 * time.Second}
	defer client.Close()
	ack, err := client.Send(context.Background(), []byte("MSH|^~\\&|||||||ADT^A01|1|P|2.5\r"))
	var dialErr *mllp.DialError
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		log.Fatal("nothing listening: ", err)
	case errors.As(err, &dialErr):
		log.Fatal("cannot connect: ", err)
	case errors.Is(err, mllp.ErrAckTimeout), errors.Is(err, mllp.ErrConnClosed):
		log.Fatal("no ack; send again later: ", err)
	case err != nil:
		log.Fatal(err)
	}
	fmt.Printf("%q\n", ack)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		log.Fatal(err)
	}
	// Output: "MSH|^~\\&|||||||ACK||P|2.5\rMSA|AA|1\r"
}
