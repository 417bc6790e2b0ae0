package window

// Parking a stream (docs/design/parking.md, the reader's contract): a
// subscription that parks dead-letters an event and parks its stream in
// one write (eventsource.Store.ParkStream). Its slot is held, as any
// letter's, until the write lands, so nothing later of the stream goes
// meanwhile; then [State.Parked] finishes it and the stream's later
// slots, never sent. The actor marks every later event of a parked stream
// Event.Parked as it gives it to the window: done as it is taken.

// parkedState is the state a slot of e starts in: done if its stream is
// parked.
func parkedState(e Event) slotState {
	if e.Parked {
		return done
	}
	return waiting
}

// Parked takes a dead letter written as it parked its stream
// ([State.LetterWritten] for a subscription that parks): its slot is
// finished, and so is every later slot of its stream, none of them sent
// (the letter's slot held the stream). An answer to a letter not being
// written changes nothing.
func (s *State) Parked(id uint64) Effects {
	if sl := s.lettering(id, letterWriting); sl != nil {
		for _, o := range s.slots {
			if o.ev.Stream == sl.ev.Stream && o.ev.Pos > sl.ev.Pos && o.state == waiting {
				s.setState(o, done)
			}
		}
	}
	return s.LetterWritten(id) // the letter's own slot, as any letter's
}
