package capm3

// PickError is a level whose image could not be had: (A) has no image,
// or several, for its selector or image_key, or the management cluster
// does not serve the image picked (yet), or the cluster's CAPM3 refuses
// its delivery. The values themselves may be well-formed: the work
// failed (render exits 1). Every other error of Render is a fault of
// its input, a value or an image record that cannot be used as it is
// (render exits 2): InputFault tells them apart.
type PickError struct{ Err error }

func (e *PickError) Error() string { return e.Err.Error() }
func (e *PickError) Unwrap() error { return e.Err }

func pickFailed(err error) error {
	if err == nil {
		return nil
	}
	return &PickError{Err: err}
}

// InputFault reports whether err, an error of Render, holds a fault of
// the input: any error in its tree that is not a PickError. A run that
// reports both is one whose input must be fixed first, since fixing it
// may change what is picked.
func InputFault(err error) bool {
	switch e := err.(type) {
	case nil:
		return false
	case *PickError:
		return false
	case interface{ Unwrap() []error }:
		for _, inner := range e.Unwrap() {
			if InputFault(inner) {
				return true
			}
		}
		return false
	case interface{ Unwrap() error }:
		if inner := e.Unwrap(); inner != nil {
			return InputFault(inner)
		}
	}
	return true
}
