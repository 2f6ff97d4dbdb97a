package runner

import (
	"context"

	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/wire"
)

// View is the one function that builds a run's view, for every surface:
// the journal's view of every call (the orchestrator's Status), with the recipe
// run's state on top when the run is a recipe run. r may be nil (a server
// without recipes). A run that neither knows is not found.
func View(ctx context.Context, o interface {
	Status(ctx context.Context, run runid.ID) (wire.RunView, error)
}, r *Runner, run runid.ID) (wire.RunView, error) {
	var rs *State
	if r != nil {
		st, err := r.Status(ctx, run)
		if err == nil {
			rs = &st
		} else if fe := fault.As(err); fe == nil || fe.Kind != fault.NotFound {
			return wire.RunView{}, err
		}
	}
	view, err := o.Status(ctx, run)
	if err != nil && rs == nil {
		return view, err
	}
	view.RunID = run.String()
	if rs != nil {
		view.Status = rs.Status
		view.Recipe, view.Objective, view.Error, view.Resumes = rs.Recipe, rs.Objective, rs.Error, rs.Resumes
		view.RecipeSteps, view.Params, view.Created, view.Finished = rs.Steps, rs.Params, &rs.Created, rs.Finished
	}
	return view, nil
}

// Started is POST /run's answer for a run just started or resumed.
func Started(st State) wire.RecipeRunStarted {
	return wire.RecipeRunStarted{RunID: st.RunID, Status: st.Status, StatusURL: "/runs/" + st.RunID,
		EventsURL: "/runs/" + st.RunID + "/events", Resumes: st.Resumes}
}

// Recipes is GET /recipes's answer: every recipe, in short, by name.
func (r *Runner) Recipes() wire.RecipeList {
	out := wire.RecipeList{Recipes: []wire.RecipeInfo{}}
	for _, rc := range r.List() {
		out.Recipes = append(out.Recipes, rc.Info(false))
	}
	return out
}
