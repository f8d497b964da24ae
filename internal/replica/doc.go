// Package replica is the protocol of image-server replicas behind one
// headless Service, which fill from each other so that the registry sends
// each image once.
//
// Each replica keeps its own verified copy. For each image, one replica
// (the first of the rendezvous order of its sha256 over the replicas
// listed, once they settled: ClaimRule, View.ConfirmClaim) pulls it from
// the registry; the others stream that download from its peer endpoints
// while it is in progress, or copy a peer's verified copy, in a tree of
// FanOut followers per replica (Tree), each relaying what it received,
// and verify every byte themselves as they would a registry pull
// (Source). A fill whose source fails continues from the bytes it kept.
// A peer that fails or sends bad bytes is reported and skipped for that
// image, as long as it runs as the same process (State.Instance), and the
// next in the order takes over. One
// replica, the holder of the Lease (Elect), publishes; an image is
// available once every ready replica holds it verified (View.Available).
//
// The pieces:
//   - Tracker follows the replicas through the Service's EndpointSlices;
//     Rendezvous orders them for an image;
//   - View polls the peers' states and answers the questions of the
//     server: may it claim a download yet, is an image available, is this
//     replica ready, which peer should fill an image;
//   - Endpoints serves this replica's state, its verified images and its
//     downloads in progress to the peers, from what a Holder (the server)
//     says it holds, waiting on the Holder's change signal;
//   - Source fills an image from one peer, under the fill package's rule.
package replica
