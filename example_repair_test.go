package jobkeys_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/jobkeys/jobkeys"
)

// A key whose stored value does not parse is never overwritten: every
// call on it fails with a StateError naming the KV key, until an operator
// inspects it and repairs it (here: deletes it) at the revision seen.
func ExampleKeyCoordinator_Repair() {
	ctx := context.Background()
	store := jobkeys.NewMemoryStore()
	coord, err := jobkeys.NewCoordinator(store, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	jt, err := coord.JobType("billing", "sync", jobkeys.Policy{Key: []string{"/account"}})
	if err != nil {
		fmt.Println(err)
		return
	}
	payload := []byte(`{"account":"a-42"}`)
	key, err := jt.Key(payload)
	if err != nil {
		fmt.Println(err)
		return
	}
	// Something other than jobkeys wrote the key.
	if _, err := store.Create(ctx, "billing", key.KVKey, []byte("not a key state")); err != nil {
		fmt.Println(err)
		return
	}

	_, err = jt.Admit(ctx, "sync-1", payload)
	var se *jobkeys.StateError
	fmt.Println("admit:", errors.Is(err, jobkeys.ErrCorruptState), errors.As(err, &se) && se.KVKey == key.KVKey)

	seen, err := coord.Inspect(ctx, "billing", key.KVKey)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("inspect: %q, usable: %t\n", seen.Value, seen.Problem == nil)
	rep, err := coord.Repair(ctx, jobkeys.RepairRequest{Service: "billing", KVKey: key.KVKey, Revision: seen.Revision})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("repair deleted it:", rep.Deleted)

	adm, err := jt.Admit(ctx, "sync-1", payload)
	fmt.Println("admit:", adm.Kind, err)
	// Output:
	// admit: true true
	// inspect: "not a key state", usable: false
	// repair deleted it: true
	// admit: accepted <nil>
}
